"""The stand-in itself: it refuses calls outside the documented envelope (so the contract tests would
catch a plugin call the real operator rejects) and reproduces the pages' worked semantics."""

from __future__ import annotations

import pytest
import torch

from . import torch_npu_standin as npu
from .torch_npu_standin import StandinError


def test_refuses_undocumented_dtypes_and_shapes():
    x = torch.randn(2, 4, 16)
    phi, alpha, bias = torch.randn(24, 64), torch.ones(3), torch.zeros(24)
    with pytest.raises(StandinError, match="bfloat16/float16 only"):
        npu.npu_mhc_pre(x, phi, alpha, bias)
    q, k = torch.randn(1, 1, 8, 128).bfloat16(), torch.randn(1, 5, 1, 128).bfloat16()
    with pytest.raises(StandinError, match="no float32 weights"):
        npu.npu_lightning_indexer(q, k, torch.randn(1, 1, 8), sparse_count=2, sparse_mode=0)
    with pytest.raises(StandinError, match="cover x's rows"):
        npu.npu_grouped_matmul(
            [torch.randn(5, 4).bfloat16()], [torch.randn(4, 3).bfloat16()] * 2,
            group_list=torch.tensor([2, 2]), split_item=3, group_type=0, group_list_type=1,
        )  # fmt: skip
    with pytest.raises(StandinError, match="valid indices must come first"):
        npu.npu_sparse_flash_attention(
            torch.zeros(1, 1, 1, 512).bfloat16(), torch.zeros(1, 3, 1, 512).bfloat16(),
            torch.zeros(1, 3, 1, 512).bfloat16(), torch.tensor([[[[0, -1, 1]]]], dtype=torch.int32), 1.0,
            query_rope=torch.zeros(1, 1, 1, 64).bfloat16(), key_rope=torch.zeros(1, 3, 1, 64).bfloat16(),
            sparse_mode=0, attention_mode=2,
        )  # fmt: skip
    with pytest.raises(StandinError, match=r"k in \[1, 1024\]"):
        npu.npu_top_k_top_p(torch.randn(1, 8), torch.ones(1), torch.tensor([0], dtype=torch.int32))


def test_init_routing_v2_on_the_pages_example():
    x = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4])
    expert_idx = torch.tensor([[1, 2], [0, 1], [0, 2]], dtype=torch.int32)
    ex, row_idx, counts, _ = npu.npu_moe_init_routing_v2(
        x, expert_idx, expert_num=3, expert_tokens_num_type=1, expert_tokens_num_flag=True
    )
    assert row_idx.tolist() == [2, 4, 0, 3, 1, 5]  # gather index: source row i*K + k -> position
    assert torch.equal(ex, x[[1, 2, 0, 1, 0, 2]]) and counts.tolist() == [2, 2, 2]


def test_finalize_routing_follows_the_pages_loop_in_both_orders():
    g = torch.Generator().manual_seed(3)
    t, k, h = 4, 2, 5
    rows = torch.randn(t * k, h, generator=g)
    scales = torch.randn(t, k, generator=g)
    perm = torch.randperm(t * k, generator=g).to(torch.int32)
    for mode in (0, 2):
        want = torch.zeros(t, h)
        for i in range(t):
            for j in range(k):
                src = j * t + i if mode == 0 else i * k + j
                want[i] += scales[i, j] * rows[perm[src]]
        got = npu.npu_moe_finalize_routing(rows, None, None, None, scales, perm, None, drop_pad_mode=mode)
        torch.testing.assert_close(got, want)


def test_top_k_top_p_keeps_ties_at_the_kth_value_and_the_top_p_nucleus():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    out = npu.npu_top_k_top_p(logits, torch.tensor([1.0]), torch.tensor([2], dtype=torch.int32))
    assert torch.isinf(out[0, [1, 4]]).all() and torch.isfinite(out[0, [0, 2, 3]]).all()
    out = npu.npu_top_k_top_p(logits, torch.tensor([0.5]), torch.tensor([5], dtype=torch.int32))
    assert torch.isfinite(out[0, 0]) and torch.isinf(out[0, 1:]).all()
