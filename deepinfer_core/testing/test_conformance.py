"""The conformance tests themselves, collected by ``pytest --pyargs deepinfer_core.testing``."""

from __future__ import annotations

import pytest

from deepinfer_core.testing.kit import all_cases, check_case

CASES = all_cases()


def test_kit_has_cases() -> None:
    assert CASES, "no conformance cases found: deepinfer_core.testing.cases_* modules are missing"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_reference(case, deepinfer_backends) -> None:
    if not case.applies_to(deepinfer_backends):
        pytest.skip(f"{case.id}: the platform does not declare kv_cache_dtype={case.kv_cache_dtype!r}")
    check_case(deepinfer_backends, case)
