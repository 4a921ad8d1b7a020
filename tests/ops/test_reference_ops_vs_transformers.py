"""Reference ops against transformers' own DeepSeek-V4 modules (and brute force where transformers has no
standalone module): the ops implement exactly the documented contracts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf

from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.quant_formats import dequant, quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.reference import ReferenceAttentionOps, ReferenceDenseOps, ReferenceMoEOps
from deepinfer_core.ops.weights import ExpertWeights

dense, attention, moe = ReferenceDenseOps(), ReferenceAttentionOps(), ReferenceMoEOps()
G = torch.Generator().manual_seed(1)
CFG = DeepseekV4Config(
    hidden_size=32,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    n_routed_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=16,
    vocab_size=50,
    swiglu_limit=1.0,
    routed_scaling_factor=1.5,
    num_hidden_layers=1,
)


def rnd(*shape, scale=1.0):
    return torch.randn(shape, generator=G) * scale


def hf_rope(x: torch.Tensor, angle: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """transformers' V4 RoPE on ``x [T, H, D]`` at per-row angles ``[T, rd/2]`` (as batch T, one position)."""
    sin = -angle.sin() if inverse else angle.sin()
    return hf.apply_rotary_pos_emb(
        x.unsqueeze(2), angle.cos()[:, None, :], sin[:, None, :], unsqueeze_dim=1
    ).squeeze(2)


@torch.no_grad()
def test_hc_pre_and_post_match_hyper_connection():
    m = hf.DeepseekV4HyperConnection(CFG)
    m.fn.copy_(rnd(*m.fn.shape, scale=0.05))
    m.base.copy_(rnd(*m.base.shape, scale=0.3))
    m.scale.copy_(rnd(3, scale=0.1) + 1)
    x = rnd(9, 4, 32)
    post, comb, collapsed = m(x[None])
    c, p, k = dense.hc_pre(x, HCParams(m.fn, m.base, m.scale, 20, CFG.hc_eps, CFG.rms_norm_eps))
    torch.testing.assert_close((c, p, k), (collapsed[0], post[0], comb[0]), atol=1e-6, rtol=1e-5)
    y = rnd(9, 32)
    want = post[0].unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb[0].transpose(-1, -2), x)
    torch.testing.assert_close(dense.hc_post(y, x, p, k), want, atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_hc_head_matches_hyper_head():
    m = hf.DeepseekV4HyperHead(CFG)
    m.hc_fn.copy_(rnd(*m.hc_fn.shape, scale=0.05))
    m.hc_base.copy_(rnd(4, scale=0.3))
    m.hc_scale.copy_(rnd(1, scale=0.1) + 1)
    x = rnd(9, 4, 32)
    got = dense.hc_head(x, HCParams(m.hc_fn, m.hc_base, m.hc_scale, 0, CFG.hc_eps, CFG.rms_norm_eps))
    torch.testing.assert_close(got, m(x[None])[0], atol=1e-6, rtol=1e-5)


def test_rms_norms_and_rope_match():
    x = rnd(9, 3, 32, scale=3)
    norm = hf.DeepseekV4RMSNorm(32, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(rnd(32).abs())
    torch.testing.assert_close(
        dense.rms_norm(x, norm.weight.detach(), 1e-6), norm(x).detach(), atol=0, rtol=0
    )
    torch.testing.assert_close(
        dense.rms_norm(x, None, 1e-6), hf.DeepseekV4UnweightedRMSNorm(1e-6)(x), atol=1e-7, rtol=1e-6
    )
    inv = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
    pos = torch.randint(0, 3000, (9,), generator=G)
    ang = pos[:, None].float() * inv
    torch.testing.assert_close(dense.rope(x, pos, inv), hf_rope(x, ang), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(
        dense.rope(x, pos, inv, inverse=True), hf_rope(x, ang, inverse=True), atol=1e-6, rtol=1e-6
    )


@torch.no_grad()
def test_routing_matches_routers():
    topk = hf.DeepseekV4TopKRouter(CFG)
    topk.weight.copy_(rnd(8, 32))
    topk.e_score_correction_bias.copy_(rnd(8, scale=0.3))
    x = rnd(9, 32)
    _, w_ref, i_ref = topk(x)
    w, i = moe.route_topk(F.linear(x, topk.weight), topk.e_score_correction_bias, 3, "sqrtsoftplus", 1.5)
    order, order_ref = i.sort(dim=1), i_ref.sort(dim=1)
    assert torch.equal(order.values, order_ref.values)
    torch.testing.assert_close(
        w.gather(1, order.indices), w_ref.gather(1, order_ref.indices), atol=1e-6, rtol=1e-5
    )

    hashed = hf.DeepseekV4HashRouter(CFG)
    hashed.weight.copy_(rnd(8, 32))
    hashed.tid2eid.copy_(torch.stack([torch.randperm(8, generator=G)[:3] for _ in range(50)]))
    ids = torch.randint(0, 50, (9,), generator=G)
    _, w_ref, i_ref = hashed(x, ids)
    torch.testing.assert_close(
        moe.route_hash(F.linear(x, hashed.weight), i_ref, "sqrtsoftplus", 1.5), w_ref, atol=1e-6, rtol=1e-5
    )


@torch.no_grad()
def test_experts_and_shared_mlp_match():
    ex = hf.DeepseekV4Experts(CFG)
    ex.gate_up_proj.copy_(rnd(8, 32, 32, scale=0.4))
    ex.down_proj.copy_(rnd(8, 32, 16, scale=0.4))
    x, ids, wts = (
        rnd(9, 32),
        torch.stack([torch.randperm(8, generator=G)[:3] for _ in range(9)]),
        torch.rand(9, 3, generator=G),
    )
    weights = ExpertWeights(
        [ex.gate_up_proj[e, :16] for e in range(8)],
        [ex.gate_up_proj[e, 16:] for e in range(8)],
        [ex.down_proj[e] for e in range(8)],
        list(range(8)),
    )
    torch.testing.assert_close(moe.experts(x, ids, wts, weights, 1.0), ex(x, ids, wts), atol=1e-6, rtol=1e-5)
    mlp = hf.DeepseekV4MLP(CFG)
    for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        lin.weight.copy_(rnd(*lin.weight.shape, scale=0.5))
    got = dense.swiglu_mlp(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, 1.0)
    torch.testing.assert_close(got, mlp(x), atol=1e-6, rtol=1e-5)


def test_quantized_linear_is_the_dequantized_matrix():
    x = rnd(5, 256)
    for qw in (
        quantize_fp8_block(rnd(130, 256)),
        quantize_fp8_block(rnd(130, 256), "ue8m0"),
        quantize_fp4_e2m1(rnd(130, 256)),
    ):
        assert torch.equal(dense.linear(x, qw), dense.linear(x, dequant(qw)))
        torch.testing.assert_close(dense.linear(x, qw), F.linear(x, dequant(qw)), atol=1e-5, rtol=1e-5)


def test_sparse_attention_is_masked_softmax_with_sinks():
    pool, cmp_pool, sinks, q = rnd(20, 16), rnd(7, 16), rnd(2), rnd(5, 2, 16)
    kv_slots = torch.tensor([[3, 4, 5, -1], [0, 1, 2, 3], [-1, -1, -1, -1], [9, 19, -1, 8], [6, -1, -1, -1]])
    cmp_slots = torch.tensor([[0, 6], [-1, -1], [2, -1], [1, 3], [-1, 5]])
    got = attention.sparse_attention(q, pool, kv_slots, cmp_pool, cmp_slots, sinks, 0.25)
    keys = torch.cat([pool, cmp_pool])
    for t in range(5):
        sel = torch.cat([kv_slots[t][kv_slots[t] >= 0], 20 + cmp_slots[t][cmp_slots[t] >= 0]])
        if sel.numel() == 0:
            assert torch.equal(got[t], torch.zeros(2, 16))
            continue
        logits = torch.cat([q[t] @ keys[sel].T * 0.25, sinks[:, None]], dim=1)
        want = torch.softmax(logits, dim=1)[:, :-1] @ keys[sel]
        torch.testing.assert_close(got[t], want, atol=1e-6, rtol=1e-5)


def test_indexer_topk_is_brute_force_topk():
    q, w, keys = rnd(4, 3, 8), rnd(4, 3).abs(), rnd(12, 8)
    cand = torch.tensor([[5, 1, 7, 11, 0, -1], [2, -1, 3, -1, -1, -1], [-1] * 6, [0, 1, 2, 3, 4, 5]])
    got = attention.indexer_topk(q, w, keys, cand, 3)
    assert got.shape == (4, 3)
    for t in range(4):
        cols = [c for c in range(6) if cand[t, c] >= 0]
        score = {c: float((F.relu(q[t] @ keys[cand[t, c]]) * w[t]).sum()) for c in cols}
        want = sorted(sorted(cols, key=lambda c: -score[c])[:3])
        assert sorted(c for c in got[t].tolist() if c >= 0) == want
        assert got[t].tolist().count(-1) == 3 - len(want)


def test_compress_pools_normalises_and_rotates():
    kv, score = rnd(2, 8, 16), rnd(2, 8, 16)
    score[0, :4] = float("-inf")
    nw, pos, inv = rnd(16).abs(), torch.tensor([0, 12]), 1.0 / 160000 ** (torch.arange(0, 8, 2).float() / 8)
    got = attention.compress(kv, score, nw, 1e-6, pos, inv)
    pooled = (kv * torch.softmax(score, dim=1)).sum(dim=1)
    normed = nw * pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + 1e-6)
    ang = pos[:, None].float() * inv
    want = hf_rope(normed[:, None], ang)[:, 0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
