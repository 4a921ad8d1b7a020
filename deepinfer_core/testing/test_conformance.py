"""The conformance tests themselves, collected by ``pytest --pyargs deepinfer_core.testing``."""

from __future__ import annotations

import pytest

from deepinfer_core.testing.kit import all_cases, check_case

CASES = all_cases()


def test_kit_has_cases() -> None:
    assert CASES, "no conformance cases found: deepinfer_core.testing.cases_* modules are missing"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_reference(case, deepinfer_backends) -> None:
    reason = case.skip_reason(deepinfer_backends)
    if reason is not None:
        pytest.skip(f"{case.id}: {reason}")
    check_case(deepinfer_backends, case)
