"""Contract tests of the ascend950 attention ops (sparse attention, lightning indexer, compressor): the
plugin's op code runs on the CPU against the torch_npu stand-in and is compared with the reference ops on
random inputs. This checks the plugin's layouts, plumbing and math against the operators' documented
semantics (and, for ``sinks``, the semantics we assume; see docs/platforms/ascend950.md), not the kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

BF16 = dict(atol=2e-2, rtol=2e-2)


def slots(rows: int, width: int, pool: int, g: torch.Generator, holes: float = 0.3) -> torch.Tensor:
    """Random slot ids with ``-1`` padding scattered anywhere in each row (not only at the end)."""
    s = torch.randint(0, pool, (rows, width), generator=g)
    return s.masked_fill(torch.rand(rows, width, generator=g) < holes, -1)


def attention_inputs(g: torch.Generator, d: int = 512, h: int = 8, t: int = 7):
    q = torch.randn(t, h, d, generator=g).bfloat16() * 0.05
    kv = torch.randn(64, d, generator=g).bfloat16()
    cmp = torch.randn(24, d, generator=g).bfloat16()
    kv_slots, cmp_slots = slots(t, 9, 64, g), slots(t, 5, 24, g)
    kv_slots[2], cmp_slots[2] = -1, -1  # a row with no valid slot returns zeros
    cmp_slots[4] = -1  # window only
    return q, kv, kv_slots, cmp, cmp_slots, torch.randn(h, generator=g), 0.07


@pytest.mark.parametrize("with_cmp", [True, False])
def test_sparse_attention_through_sparse_flash_attention_matches_reference(
    ascend, ref, all_fused, gen, with_cmp
):
    q, kv, ks, cmp, cs, sinks, scale = attention_inputs(gen)
    if not with_cmp:
        cmp, cs = None, None
    got = ascend.attention.sparse_attention(q, kv, ks, cmp, cs, sinks, scale)
    torch.testing.assert_close(got, ref.attention.sparse_attention(q, kv, ks, cmp, cs, sinks, scale), **BF16)
    assert torch.count_nonzero(got[2]) == 0
    assert all_fused.calls["npu_sparse_flash_attention"] == 1


def test_sparse_attention_defaults_to_plain_torch(standin, ref, gen):
    """The sinks formula of npu_sparse_flash_attention is undocumented: off unless switched on."""
    from deepinfer_core.testing import backends_for

    ascend = backends_for("ascend950")
    q, kv, ks, cmp, cs, sinks, scale = attention_inputs(gen)
    got = ascend.attention.sparse_attention(q, kv, ks, cmp, cs, sinks, scale)
    torch.testing.assert_close(got, ref.attention.sparse_attention(q, kv, ks, cmp, cs, sinks, scale), **BF16)
    assert standin.calls["npu_sparse_flash_attention"] == 0


def test_sparse_attention_chunks_rows_without_changing_results(ascend, ref, monkeypatch, gen):
    from deepinfer_ascend950.ops import attention

    monkeypatch.setattr(attention, "GATHER_BUDGET", 1)  # one row per chunk
    q, kv, ks, cmp, cs, sinks, scale = attention_inputs(gen, d=64)
    got = ascend.attention.sparse_attention(q, kv, ks, cmp, cs, sinks, scale)
    torch.testing.assert_close(got, ref.attention.sparse_attention(q, kv, ks, cmp, cs, sinks, scale), **BF16)


def true_scores(q, weights, key_pool, cand) -> torch.Tensor:
    keys = key_pool[cand.clamp(min=0)].float()
    s = (F.relu(torch.einsum("thd,tcd->thc", q.float(), keys)) * weights.float()[..., None]).sum(1)
    return s.masked_fill(cand < 0, float("-inf"))


@pytest.mark.parametrize("heads", [8, 64])
def test_indexer_through_lightning_indexer_selects_the_top_scores(ascend, ref, all_fused, gen, heads):
    """Same number of picks per row as the reference, every pick a valid candidate column, and the picked
    true (float32) scores equal the reference's top-k up to bf16 rounding of the weights."""
    t, c, k = 6, 40, 12
    q = torch.randn(t, heads, 128, generator=gen).bfloat16()
    w = torch.randn(t, heads, generator=gen) / heads
    pool = torch.randn(90, 128, generator=gen).bfloat16()
    cand = slots(t, c, 90, gen, holes=0.2)
    cand[1, 5:] = -1  # fewer valid candidates than k
    got = ascend.attention.indexer_topk(q, w, pool, cand, k)
    want = ref.attention.indexer_topk(q, w, pool, cand, k)
    assert got.shape == want.shape and got.dtype == torch.int64
    assert torch.equal((got >= 0).sum(1), (want >= 0).sum(1))
    score = true_scores(q, w, pool, cand)
    for r in range(t):
        g_cols, w_cols = got[r][got[r] >= 0], want[r][want[r] >= 0]
        assert len(set(g_cols.tolist())) == len(g_cols) and bool((cand[r, g_cols] >= 0).all())
        scale = score[r][w_cols].abs().max().item() if len(w_cols) else 1.0
        torch.testing.assert_close(
            score[r][g_cols].sort().values, score[r][w_cols].sort().values, atol=2e-2 * scale, rtol=0
        )
    assert all_fused.calls["npu_lightning_indexer"] == 1


def test_indexer_outside_the_envelope_is_exact_torch(ascend, ref, all_fused, gen):
    """float32 and head dim 64 are outside npu_lightning_indexer's support: torch, identical picks."""
    q = torch.randn(5, 4, 64, generator=gen)
    w = torch.randn(5, 4, generator=gen)
    pool = torch.randn(30, 64, generator=gen)
    cand = slots(5, 20, 30, gen)
    got, want = (
        ascend.attention.indexer_topk(q, w, pool, cand, 8),
        ref.attention.indexer_topk(q, w, pool, cand, 8),
    )
    assert [sorted(r.tolist()) for r in got] == [sorted(r.tolist()) for r in want]
    assert all_fused.calls["npu_lightning_indexer"] == 0


def test_compress_matches_reference(ascend, ref, all_fused, gen):
    e, length, d = 5, 4, 64
    kv = torch.randn(e, length, d, generator=gen).bfloat16()
    score = torch.randn(e, length, d, generator=gen)
    score[0, 2:] = float("-inf")  # a partly empty window
    norm_w = torch.rand(d, generator=gen) + 0.5
    pos = torch.randint(0, 1000, (e,), generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    got = ascend.attention.compress(kv, score, norm_w, 1e-6, pos, inv)
    torch.testing.assert_close(got, ref.attention.compress(kv, score, norm_w, 1e-6, pos, inv), **BF16)
    assert all_fused.calls["npu_rms_norm"] == 1 and all_fused.calls["npu_rotary_mul"] == 1
