"""The KV-writing attention cases (store_kv, write_compressor_state, compress_into) are valid: their inputs
are deterministic and random, the reference passes them, and a deliberately wrong op fails each."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.ops.reference import ReferenceAttentionOps
from deepinfer_core.testing import cases_kv_store, check_case
from deepinfer_core.testing.kit import reference_backends

CASES = {c.id: c for c in cases_kv_store.CASES}
REFERENCE = reference_backends()


def _floats(obj) -> list[torch.Tensor]:
    items = obj if isinstance(obj, (list, tuple)) else [obj]
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1]


@pytest.mark.parametrize("case", cases_kv_store.CASES, ids=lambda c: c.id)
def test_inputs_are_deterministic_random_and_the_reference_passes(case):
    (a, _), (b, _) = (case.make_inputs(torch.Generator().manual_seed(5)) for _ in range(2))
    for x, y in zip(a, b):
        assert not isinstance(x, torch.Tensor) or torch.equal(x, y)
    assert all(torch.count_nonzero(t) > 0 for t in _floats(a))
    assert any(isinstance(x, torch.Tensor) and x.dtype == torch.int64 and bool((x < 0).any()) for x in a), (
        "every case writes through scratch slots (-1)"
    )
    check_case(REFERENCE, case)


class ScratchToSlotZero(ReferenceAttentionOps):
    """Sends the scratch slot's rows to slot 0 instead of the pool's last row."""

    def store_kv(self, pool, slots, values, kv_format):
        super().store_kv(pool, slots.clamp(min=0), values, kv_format)


class OnePercentOff(ReferenceAttentionOps):
    def store_kv(self, pool, slots, values, kv_format):
        super().store_kv(pool, slots, values * 1.01, kv_format)


class BiasOfPositionZero(ReferenceAttentionOps):
    """Adds the position bias of window offset 0 to every token."""

    def write_compressor_state(self, state, slots, kv, gate, ape, positions):
        super().write_compressor_state(state, slots, kv, gate, ape, positions * 0)


class EmptyRowsRead(ReferenceAttentionOps):
    """Reads state slot 0 for a window's empty rows instead of leaving them out."""

    def compress_into(self, state, src_slots, overlap, *args, **kwargs):
        super().compress_into(state, src_slots.clamp(min=0), overlap, *args, **kwargs)


class RopeOnePositionLate(ReferenceAttentionOps):
    def compress_into(self, state, src_slots, overlap, norm_weight, eps, positions, *args, **kwargs):
        super().compress_into(state, src_slots, overlap, norm_weight, eps, positions + 1, *args, **kwargs)


@pytest.mark.parametrize(
    "wrong,case_id",
    [
        (ScratchToSlotZero(), "attention.store_kv[plain_scratch_slots]"),
        (ScratchToSlotZero(), "attention.store_kv[fp8_packed_scratch_slots]"),
        (OnePercentOff(), "attention.store_kv[plain_scratch_slots]"),
        (OnePercentOff(), "attention.store_kv[fp8_packed_scratch_slots]"),
        (BiasOfPositionZero(), "attention.write_compressor_state[scratch_slots]"),
        (EmptyRowsRead(), "attention.compress_into[csa_overlap]"),
        (EmptyRowsRead(), "attention.compress_into[hca]"),
        (EmptyRowsRead(), "attention.compress_into[fp8_packed_csa]"),
        (RopeOnePositionLate(), "attention.compress_into[csa_overlap]"),
        (RopeOnePositionLate(), "attention.compress_into[fp8_packed_csa]"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_a_wrong_write_fails_the_case(wrong, case_id):
    with pytest.raises(AssertionError, match=case_id.replace("[", r"\[").replace("]", r"\]")):
        check_case(dataclasses.replace(REFERENCE, attention=wrong), CASES[case_id])


def test_a_write_to_the_scratch_slot_is_not_compared():
    class ScratchGarbage(ReferenceAttentionOps):
        def store_kv(self, pool, slots, values, kv_format):
            super().store_kv(pool, slots, values, kv_format)
            pool[-1] = pool[-1].flip(0)  # the scratch row may hold anything

    check_case(
        dataclasses.replace(REFERENCE, attention=ScratchGarbage()),
        CASES["attention.store_kv[plain_scratch_slots]"],
    )
