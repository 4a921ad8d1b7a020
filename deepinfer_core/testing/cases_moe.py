"""Conformance cases for the MoE ops: sqrt-softplus / sigmoid / softmax top-k routing with a selection-only
bias, hash routing, and routed experts with plain, FP8 and FP4 weights, all or some experts local."""

from __future__ import annotations

import torch

from deepinfer_core.ops.act_quant import FP8_ACT_BLOCK
from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.weights import ExpertWeights
from deepinfer_core.testing.cases_dense import needs_activation_quant, randn
from deepinfer_core.testing.opcase import OpCase

T, E, K, D, INTER = 7, 12, 3, 64, 32


def _route(score_func: str, bias: bool):
    return lambda g: ((randn(g, T, E), randn(g, E, scale=0.3) if bias else None, K, score_func, 1.5), {})


def _same_routing(actual, expected, inputs) -> None:
    """Routing returns a set of experts per row: compare (id, weight) pairs order-free."""
    (aw, ai), (ew, ei) = actual, expected
    assert ai.shape == ei.shape and aw.shape == ew.shape, "route_topk: wrong shapes"
    for r in range(ei.shape[0]):
        a = sorted(zip(ai[r].tolist(), aw[r].tolist()))
        e = sorted(zip(ei[r].tolist(), ew[r].tolist()))
        assert [i for i, _ in a] == [i for i, _ in e], f"route_topk row {r}: experts {a} != {e}"
        torch.testing.assert_close(
            torch.tensor([w for _, w in a]), torch.tensor([w for _, w in e]), atol=1e-6, rtol=1e-5
        )


def _hash(g):
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    return (randn(g, T, E), ids, "sqrtsoftplus", 2.0), {}


def _experts(quant: str | None, local: list[int] | None):
    def make(g):
        def w(o, i):
            m = randn(g, o, i, scale=i**-0.5)
            if quant == "fp4_act":  # V4.1's routed experts with the release's FP8 GEMM inputs
                q = quantize_fp4_e2m1(m)
                q.act_block = FP8_ACT_BLOCK
                return q
            return quantize_fp8_block(m) if quant == "fp8" else quantize_fp4_e2m1(m) if quant == "fp4" else m

        n = 6
        experts = ExpertWeights(
            w1=[w(INTER, D) for _ in range(n)],
            w3=[w(INTER, D) for _ in range(n)],
            w2=[w(D, INTER) for _ in range(n)],
            expert_ids=list(range(n)),
        )
        if local is not None:
            experts = ExpertWeights(
                [experts.w1[i] for i in local],
                [experts.w3[i] for i in local],
                [experts.w2[i] for i in local],
                local,
            )
        ids = torch.stack([torch.randperm(n, generator=g)[:2] for _ in range(T)])
        weights = torch.rand((T, 2), generator=g) + 0.1
        return (randn(g, T, D), ids, weights, experts, 2.0), {}

    return make


CASES = [
    OpCase("moe", "route_topk", "sqrtsoftplus_bias", _route("sqrtsoftplus", True), compare=_same_routing),
    OpCase("moe", "route_topk", "sigmoid_bias", _route("sigmoid", True), compare=_same_routing),
    OpCase("moe", "route_topk", "softmax_nobias", _route("softmax", False), compare=_same_routing),
    OpCase("moe", "route_hash", "sqrtsoftplus", _hash, atol=1e-6, rtol=1e-5),
    OpCase("moe", "experts", "plain", _experts(None, None), atol=1e-4, rtol=1e-4),
    OpCase("moe", "experts", "fp8_block", _experts("fp8", None), atol=1e-4, rtol=1e-4),
    OpCase("moe", "experts", "fp4_e2m1", _experts("fp4", None), atol=1e-4, rtol=1e-4),
    OpCase(
        "moe",
        "experts",
        "fp4_e2m1_act",
        _experts("fp4_act", None),
        atol=1e-4,
        rtol=1e-4,
        requires=needs_activation_quant,
    ),
    OpCase("moe", "experts", "local_subset", _experts(None, [1, 3, 4]), atol=1e-4, rtol=1e-4),
]
