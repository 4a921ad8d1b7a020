"""The ``kv_roundtrip`` cases (V4.1's codecs) are valid: deterministic random inputs that reach the -0.0 case, the
reference passes them, and a round trip that skips the codec or loses a signed zero fails each."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.ops.reference import ReferenceAttentionOps
from deepinfer_core.testing import cases_attention, check_case
from deepinfer_core.testing.kit import reference_backends

CASES = [c for c in cases_attention.CASES if c.op == "kv_roundtrip"]
REFERENCE = reference_backends()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_inputs_are_deterministic_random_and_the_reference_passes(case):
    (a, _), (b, _) = (case.make_inputs(torch.Generator().manual_seed(5)) for _ in range(2))
    assert torch.equal(a[0], b[0]) and torch.count_nonzero(a[0]) > 0
    assert bool(
        torch.signbit(a[1].roundtrip(a[0])).logical_and(a[1].roundtrip(a[0]) == 0).any()
    )  # -0.0 results
    check_case(REFERENCE, case)


class NoCodec(ReferenceAttentionOps):
    def kv_roundtrip(self, values, kv_format):
        return values.clone()


class UnsignedZeros(ReferenceAttentionOps):
    def kv_roundtrip(self, values, kv_format):
        out = super().kv_roundtrip(values, kv_format)
        return torch.where(out == 0, torch.zeros_like(out), out)


@pytest.mark.parametrize("wrong", [NoCodec(), UnsignedZeros()], ids=lambda w: type(w).__name__)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_wrong_round_trip_fails_the_case(wrong, case):
    with pytest.raises(AssertionError, match=case.id.replace("[", r"\[").replace("]", r"\]")):
        check_case(dataclasses.replace(REFERENCE, attention=wrong), case)
