"""The ``indexer_topk_slots`` cases are valid: the reference passes them (its default looks the slots up after
``indexer_topk``), each has rows with fewer valid candidates than top-k, and an op that returns the columns, or
loses a slot, fails each."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.ops.reference import ReferenceAttentionOps
from deepinfer_core.testing import cases_attention, check_case
from deepinfer_core.testing.kit import reference_backends

CASES = [c for c in cases_attention.CASES if c.op == "indexer_topk_slots"]
REFERENCE = reference_backends()


def test_there_are_plain_and_packed_key_cases():
    assert {c.name for c in CASES} == {"topk_with_short_rows", "v41_fp4_keys"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_reference_passes_and_rows_run_short(case):
    args, kwargs = case.make_inputs(torch.Generator().manual_seed(2))
    cand, topk = args[3], args[4]
    assert bool(((cand >= 0).sum(1) < topk).any())  # a row with fewer valid candidates than top-k
    slots = REFERENCE.attention.indexer_topk_slots(*args, **kwargs)
    assert bool((slots == -1).any()) and bool((slots > 0).any())
    check_case(REFERENCE, case)


class Columns(ReferenceAttentionOps):
    def indexer_topk_slots(self, q, weights, key_pool, cand_slots, topk, key_format=None):
        return self.indexer_topk(q, weights, key_pool, cand_slots, topk, key_format=key_format)


class DropsOne(ReferenceAttentionOps):
    def indexer_topk_slots(self, q, weights, key_pool, cand_slots, topk, key_format=None):
        out = super().indexer_topk_slots(q, weights, key_pool, cand_slots, topk, key_format=key_format)
        out[:, 0] = -1
        return out


@pytest.mark.parametrize("wrong", [Columns(), DropsOne()], ids=lambda w: type(w).__name__)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_wrong_lookup_fails_the_case(wrong, case):
    with pytest.raises(AssertionError, match="top-k row"):
        check_case(dataclasses.replace(REFERENCE, attention=wrong), case)
