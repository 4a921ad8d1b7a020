"""Contract tests of the ascend950 MoE ops (gating top-k, init routing, grouped matmul, finalize routing):
the plugin's op code runs on the CPU against the torch_npu stand-in and is compared with the reference
ops on random inputs. This checks the plugin's layouts, plumbing and math against the operators'
documented semantics, not the Ascend kernels."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.weights import ExpertWeights

BF16 = dict(atol=2e-2, rtol=2e-2)


def experts(
    g: torch.Generator, expert_ids: list[int], fmt: str, d: int = 64, inter: int = 32
) -> ExpertWeights:
    def w(out_f: int, in_f: int):
        m = torch.randn(out_f, in_f, generator=g) * 0.1
        return {
            "bf16": torch.Tensor.bfloat16,
            "fp8_block": quantize_fp8_block,
            "fp4_e2m1": quantize_fp4_e2m1,
        }[fmt](m)

    n = len(expert_ids)
    return ExpertWeights(
        w1=[w(inter, d) for _ in range(n)],
        w3=[w(inter, d) for _ in range(n)],
        w2=[w(d, inter) for _ in range(n)],
        expert_ids=expert_ids,
    )


def routed(g: torch.Generator, t: int, n_global: int, k: int):
    ids = torch.stack([torch.randperm(n_global, generator=g)[:k] for _ in range(t)])
    return ids, torch.rand(t, k, generator=g) + 0.1


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_route_topk_matches_reference(ascend, ref, all_fused, gen, score_func, with_bias):
    logits = torch.randn(9, 32, generator=gen) * 2
    bias = torch.randn(32, generator=gen) * 0.2 if with_bias else None
    w, ids = ascend.moe.route_topk(logits, bias, 6, score_func, 2.5)
    w_ref, ids_ref = ref.moe.route_topk(logits, bias, 6, score_func, 2.5)
    assert ids.dtype == torch.int64 and torch.equal(ids.sort(1).values, ids_ref.sort(1).values)
    order, order_ref = ids.argsort(1), ids_ref.argsort(1)
    torch.testing.assert_close(w.gather(1, order), w_ref.gather(1, order_ref))
    fused = score_func != "sqrtsoftplus"
    assert all_fused.calls["npu_moe_gating_top_k"] == int(fused)


def test_route_hash_matches_reference(ascend, ref, gen):
    logits = torch.randn(5, 16, generator=gen)
    ids = torch.randint(0, 16, (5, 4), generator=gen)
    torch.testing.assert_close(
        ascend.moe.route_hash(logits, ids, "sqrtsoftplus", 1.5),
        ref.moe.route_hash(logits, ids, "sqrtsoftplus", 1.5),
    )


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "fp4_e2m1"])
def test_experts_through_routing_and_grouped_matmul_match_reference(ascend, ref, all_fused, gen, fmt):
    """4 local experts out of 8 (expert parallelism): non-local picks must contribute nothing."""
    ew = experts(gen, [1, 3, 4, 6], fmt)
    x = torch.randn(7, 64, generator=gen).bfloat16()
    ids, weights = routed(gen, 7, 8, 3)
    got = ascend.moe.experts(x, ids, weights, ew, 0.5)
    torch.testing.assert_close(got, ref.moe.experts(x, ids, weights, ew, 0.5), **BF16)
    calls = all_fused.calls
    assert calls["npu_moe_init_routing_v2"] == 1 and calls["npu_grouped_matmul"] == 3
    assert calls["npu_moe_finalize_routing"] == 1


def test_experts_with_no_local_pick_return_zeros(ascend, gen):
    ew = experts(gen, [0, 1], "bf16")
    x = torch.randn(4, 64, generator=gen).bfloat16()
    ids = torch.full((4, 2), 5)
    assert torch.count_nonzero(ascend.moe.experts(x, ids, torch.rand(4, 2, generator=gen), ew, 0.0)) == 0


def test_more_than_127_local_experts_use_one_stacked_weight(ascend, ref, all_fused, gen):
    """Past 128 groups a list of weights is not allowed with group_list_type=1; the plugin stacks them."""
    ew = experts(gen, list(range(130)), "bf16", d=16, inter=16)
    x = torch.randn(6, 16, generator=gen).bfloat16()
    ids, weights = routed(gen, 6, 130, 4)
    got = ascend.moe.experts(x, ids, weights, ew, 0.0)
    torch.testing.assert_close(got, ref.moe.experts(x, ids, weights, ew, 0.0), **BF16)
    assert all_fused.calls["npu_grouped_matmul"] == 3


def test_float32_experts_take_the_torch_path(ascend, ref, all_fused, gen):
    ew = experts(gen, [0, 2, 5], "bf16")
    ew.w1, ew.w3, ew.w2 = ([w.float() for w in ws] for ws in (ew.w1, ew.w3, ew.w2))
    x = torch.randn(5, 64, generator=gen)
    ids, weights = routed(gen, 5, 6, 2)
    torch.testing.assert_close(
        ascend.moe.experts(x, ids, weights, ew, 0.4), ref.moe.experts(x, ids, weights, ew, 0.4)
    )
    assert all_fused.calls["npu_grouped_matmul"] == 0
