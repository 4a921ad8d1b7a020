"""The dense / attention / MoE conformance cases are valid: deterministic, non-trivial inputs, the reference
passes them, and their comparisons catch a wrong result."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.reference import ReferenceAttentionOps, ReferenceMoEOps, reference_op
from deepinfer_core.testing import cases_attention, cases_dense, cases_moe, check_case

CASES = cases_dense.CASES + cases_attention.CASES + cases_moe.CASES
REFERENCE = Backends("reference", **{c: reference_op(c) for c in CONCERNS})


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_inputs_are_deterministic_and_the_reference_passes(case):
    a, b = (
        case.make_inputs(torch.Generator().manual_seed(3)),
        case.make_inputs(torch.Generator().manual_seed(3)),
    )
    for x, y in zip(_tensors(a), _tensors(b)):
        assert torch.equal(x, y)
    floats = [t for t in _tensors(a) if t.is_floating_point() and t.numel() > 1]
    if not floats:  # an op over integers (V4.1's Engram hashes): random integer inputs, never zeros
        floats = [t for t in _tensors(a) if t.dtype != torch.bool and t.numel() > 1]
    assert floats and all(torch.count_nonzero(t.float()) > 0 for t in floats)
    assert hasattr(getattr(REFERENCE, case.concern), case.op)
    check_case(REFERENCE, case)


def test_case_names_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)


class _OffByOneTopk(ReferenceAttentionOps):
    def indexer_topk(self, q, weights, key_pool, cand_slots, topk):
        out = super().indexer_topk(q, weights, key_pool, cand_slots, topk + 1)
        return out[:, 1:]  # drops the best candidate, keeps the (k+1)-th


class _NoBias(ReferenceMoEOps):
    def route_topk(self, logits, correction_bias, top_k, score_func, routed_scaling_factor):
        return super().route_topk(logits, None, top_k, score_func, routed_scaling_factor)


class _TiltedSinks(ReferenceAttentionOps):
    def sparse_attention(self, q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale):
        return super().sparse_attention(q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks + 0.01, scale)


class _OneImage(ReferenceAttentionOps):
    def encoder_attention(self, q, k, v, cu_seqlens, scale):
        return super().encoder_attention(q, k, v, cu_seqlens[[0, -1]], scale)  # images see each other


@pytest.mark.parametrize(
    "concern,wrong,case_id",
    [
        ("attention", _OffByOneTopk(), "attention.indexer_topk[topk_with_short_rows]"),
        ("moe", _NoBias(), "moe.route_topk[sqrtsoftplus_bias]"),
        ("attention", _TiltedSinks(), "attention.sparse_attention[sliding_window_sinks]"),
        ("attention", _OneImage(), "attention.encoder_attention[three_images]"),
    ],
)
def test_cases_catch_a_wrong_backend(concern, wrong, case_id):
    case = next(c for c in CASES if c.id == case_id)
    with pytest.raises(AssertionError):
        check_case(dataclasses.replace(REFERENCE, **{concern: wrong}), case)
