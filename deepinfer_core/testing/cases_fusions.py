"""Conformance cases for the fused ops (:class:`~deepinfer_core.ops.fusions.Fusion`).

Each runs the step as the backend's resolved table has it (its fused op where it declares one, else the
core's composition of its own plain ops) against the composition of the reference's plain ops; a backend
that declares nothing runs the compositions and passes whenever its plain ops do."""

from __future__ import annotations

import torch

from deepinfer_core.testing.cases_attention import _indexer, _same_topk, _sparse, _sparse_fp8
from deepinfer_core.testing.cases_dense import _hc_post, _hc_pre, _swiglu, inv_freq, randn
from deepinfer_core.testing.opcase import OpCase


def _linear_f32(g):
    """The MoE router: bf16 activations, a float32 weight, float32 logits."""
    return (randn(g, 5, 64).to(torch.bfloat16), randn(g, 48, 64, scale=0.125)), {}


def _norm_rope(weighted: bool):
    """Query heads (unweighted) and the KV row (weighted, one head), rows of 40 channels with 16 rotated."""

    def make(g):
        h = 1 if weighted else 4
        w = randn(g, 40).abs() + 0.5 if weighted else None
        return (
            randn(g, 6, h, 40, scale=3.0),
            w,
            1e-6,
            torch.randint(0, 5000, (6,), generator=g),
            inv_freq(16),
        ), {}

    return make


def _hc_pre_norm(g):
    """``hc_pre``'s case plus the sublayer's norm weight."""
    (x, hc), _ = _hc_pre(g)
    return (x, hc, randn(g, x.shape[2]).abs() + 0.5), {}


def _hc_post_pre(g):
    """``hc_post``'s case, then the next sublayer's mHC parameters and norm weight."""
    (y, residual, post, comb), _ = _hc_post(g)
    return (y, residual, post, comb, *_hc_pre_norm(g)[0][1:]), {}


def _hc_site_norm(g):
    """V4.1's site entry: ``hc_pre``'s case, the site before's ``pre`` (positive, float32) and a norm weight."""
    (x, hc), _ = _hc_pre(g)
    t, n, d = x.shape
    pre = torch.rand(t, n, generator=g) + 0.25
    return (x, hc, pre, randn(g, d).abs() + 0.5), {}


def _hc_post_site_norm(g):
    """``hc_post``'s case, then the next site's parameters, the ``pre`` it collapses with and its norm weight."""
    (y, residual, post, comb), _ = _hc_post(g)
    return (y, residual, post, comb, *_hc_site_norm(g)[0][1:]), {}


def _swiglu_mlp_add(quant: bool):
    """The shared expert (plain or FP8-block weights) and the routed experts' output it is added to."""

    def make(g):
        (x, w1, w3, w2, limit), _ = _swiglu(quant, 1.5)(g)
        return (x, w1, w3, w2, limit, randn(g, *x.shape, scale=0.5)), {}

    return make


def _indexer_select(g):
    """The indexer's case with unscaled bf16 weights and a scale: slot ids come back, not columns."""
    (q, w, keys, cand, k), _ = _indexer(g)
    return (q, w.to(torch.bfloat16), 0.125, keys, cand, k), {}


def _unrope(fp8: bool):
    """Attention over both pools (one row with no slot), then its output rotated back at random positions
    (RoPE on the last 8 channels); plain or FP8-packed pools."""

    def make(g):
        args, kw = (_sparse_fp8 if fp8 else _sparse(True, True))(g)
        positions = torch.randint(0, 5000, (args[0].shape[0],), generator=g)
        return (*args, positions, inv_freq(8)), kw

    return make


def _rope_unrope(fp8: bool):
    """The query rotated (the FP8 case: normed per head first, as V4's), attention over both pools, the output
    rotated back (RoPE on the last 8 channels at random positions)."""

    def make(g):
        args, kw = _unrope(fp8)(g)
        return args, {**kw, "q_norm_eps": 1e-6} if fp8 else kw

    return make


CASES = [
    OpCase("dense", "linear_f32", "bf16_x_f32_weight", _linear_f32, atol=1e-5, rtol=1e-5, fusion=True),
    OpCase("dense", "rms_norm_rope", "query_heads", _norm_rope(False), atol=1e-5, rtol=1e-4, fusion=True),
    OpCase("dense", "rms_norm_rope", "kv_row", _norm_rope(True), atol=1e-5, rtol=1e-4, fusion=True),
    OpCase("dense", "hc_pre_norm", "hc4_sinkhorn20", _hc_pre_norm, atol=1e-5, rtol=1e-4, fusion=True),
    OpCase("dense", "hc_post_pre", "hc4_sinkhorn20", _hc_post_pre, atol=1e-5, rtol=1e-4, fusion=True),
    OpCase("dense", "hc_site_norm", "hc4_sinkhorn20", _hc_site_norm, atol=1e-5, rtol=1e-4, fusion=True),
    OpCase(
        "dense", "hc_post_site_norm", "hc4_sinkhorn20", _hc_post_site_norm, atol=1e-5, rtol=1e-4, fusion=True
    ),
    OpCase("dense", "swiglu_mlp_add", "plain", _swiglu_mlp_add(False), atol=1e-4, rtol=1e-4, fusion=True),
    OpCase("dense", "swiglu_mlp_add", "fp8_block", _swiglu_mlp_add(True), atol=1e-4, rtol=1e-4, fusion=True),
    OpCase(
        "attention", "indexer_select", "slots_bf16_weights", _indexer_select, compare=_same_topk, fusion=True
    ),
    *(
        OpCase(
            "attention",
            op,
            name,
            make(fp8),
            atol=1e-5,
            rtol=1e-4,
            fusion=True,
            **({"kv_cache_dtype": "fp8"} if fp8 else {}),
        )
        for op, make, fp8_name in (
            ("sparse_attention_unrope", _unrope, "fp8_kv_cache"),
            ("rope_sparse_attention_unrope", _rope_unrope, "fp8_kv_cache_normed_query"),
        )
        for fp8, name in ((False, "window_plus_compressed"), (True, fp8_name))
    ),  # fmt: skip
]
