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


def _index_query(codec: bool):
    """V4.1's index query: 5 tokens x 4 heads of 64 (RoPE on the last 16 channels at random positions), bf16 head
    weights and a scale; with ``codec``, float32 rows round-tripped through the index keys' FP4 format (e2m1
    codes, a ue8m0 scale per 32)."""

    def make(g):
        from deepinfer_core.kv.packed import PackedFormat
        from deepinfer_core.models.deepseek_v41.kv_formats import PackedKV

        q, w = randn(g, 5, 4, 64) * 3.0, randn(g, 5, 4).to(torch.bfloat16)
        positions = torch.randint(0, 5000, (5,), generator=g)
        fmt = PackedKV(PackedFormat("e2m1", "ue8m0", 32, (64,)), torch.float32) if codec else None
        return (q, w, 0.0221, positions, inv_freq(16), fmt), {}

    return make


def _close_index_query(case_id: str, codec: bool):
    """The weights equal; the query close to the reference's (without a codec) or, through the codec, equal
    but for at most 1% of the values, each one code away (a rotation's last bit may land a value on the other
    side of a rounding boundary): within the largest grid step of its block, 2 x its scale <= 2/3 of its
    largest magnitude."""

    def compare(actual, expected, inputs) -> None:
        (qa, wa), (qe, we) = actual, expected
        assert wa.dtype == torch.float32 and torch.equal(wa, we), (
            f"{case_id}: weights not weights.float() * scale"
        )
        assert qa.dtype == qe.dtype and qa.shape == qe.shape, f"{case_id}: the query's dtype or shape"
        if not codec:
            torch.testing.assert_close(qa, qe, atol=1e-5, rtol=1e-4, msg=lambda m: f"{case_id}: {m}")
            return
        a, e = qa.float().reshape(-1, 32), qe.float().reshape(-1, 32)
        off = a != e
        assert off.float().mean().item() <= 0.01, (
            f"{case_id}: {int(off.sum())} of {off.numel()} values differ"
        )
        bound = e.abs().amax(dim=1, keepdim=True) * (2 / 3) + 1e-6
        assert bool(((a - e).abs() <= bound).all()), f"{case_id}: a value more than one code away"

    return compare


def _static_plan(g):
    """A static step of 6 requests x 2 rows (one request all padding, one row of another padding: position
    -1), positions from 0 to 250 (entries closing and not, windows reaching before position 0), block
    tables 16 wide with the blocks each request needs (random ids) and one released block in each group;
    window 8, ratios 4 (overlapped) and 16, block size 16, context bucket 256."""
    bs, q, width = 16, 2, 16
    starts = torch.randint(0, 250 - q, (6,), generator=g).tolist()
    starts[1] = 3  # both rows' windows reach before position 0
    pos, tables = [], {"window": [], "compressed": []}
    for b, start in enumerate(starts):
        real = 0 if b == 5 else (1 if b == 4 else q)
        pos += list(range(start, start + real)) + [-1] * (q - real)
        need = (start + real + bs - 1) // bs if real else 0
        for group in tables:
            tables[group].append(torch.randperm(200, generator=g)[:need].tolist() + [-1] * (width - need))
    window, compressed = (torch.tensor(tables[k], dtype=torch.int64) for k in ("window", "compressed"))
    window[0, starts[0] // bs] = -1  # released: nothing is read there, and the token written to scratch
    compressed[2, 0] = -1
    return (
        torch.tensor(pos, dtype=torch.int64),
        window,
        compressed,
        q,
        8,
        ((4, True), (16, False)),
        256,
        bs,
    ), {}


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
    *(
        OpCase(
            "attention",
            "index_query",
            name,
            _index_query(codec),
            compare=_close_index_query(f"attention.index_query[{name}]", codec),
            fusion=True,
        )
        for codec, name in ((False, "rotated"), (True, "v41_fp4_keys"))
    ),
    # slot ids: exact
    OpCase("attention", "static_plan", "decode_q2_csa4_hca16", _static_plan, atol=0, rtol=0, fusion=True),
]
