"""Dense kernels (RMSNorm, RoPE, mHC, quantized linear, SwiGLU) against the reference dense ops."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.compose import (
    compose_hc_post_pre,
    compose_hc_post_site_norm,
    compose_hc_pre_norm,
    compose_hc_site_norm,
)
from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.reference import reference_op

from .cuda_sm100_helpers import BOUND, INTERPRETED, Counting, dev, needs_triton, rand, rel_err

pytestmark = needs_triton


@pytest.fixture(scope="module")
def ops():
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    return CudaDenseOps()


REF = reference_op("dense")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_matches_reference(ops, gen, dtype, weighted):
    x = rand(gen, 5, 3, 40, dtype=dtype, scale=3.0)
    w = rand(gen, 40) if weighted else None
    got = ops.rms_norm(*dev(x, w), 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    assert rel_err(got, REF.rms_norm(x, w, 1e-6)) < BOUND[dtype]


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_rotates_trailing_pairs_only(ops, gen, inverse, dtype):
    x = rand(gen, 6, 3, 24, dtype=dtype)
    pos = torch.randint(0, 5000, (6,), generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    got = ops.rope(*dev(x, pos, inv_freq), inverse=inverse)
    ref = REF.rope(x, pos, inv_freq, inverse)
    assert torch.equal(got[..., :16].cpu(), x[..., :16])
    assert rel_err(got, ref) < BOUND[dtype]


def _hc_inputs(gen, T=5, N=4, D=48, dtype=torch.bfloat16):
    x = rand(gen, T, N, D, dtype=dtype)
    fn = rand(gen, (2 + N) * N, N * D, scale=0.05)
    base = rand(gen, (2 + N) * N, scale=0.5)
    scale = rand(gen, 3).abs() + 0.5
    return x, fn, base, scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 11])
def test_hc_pre_matches_reference(ops, gen, dtype, T):
    x, fn, base, scale = _hc_inputs(gen, T=T, dtype=dtype)
    got = ops.hc_pre(dev(x), HCParams(*dev(fn, base, scale), 20, 1e-6, 1e-6))
    ref = REF.hc_pre(x, HCParams(fn, base, scale, 20, 1e-6, 1e-6))
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        assert rel_err(g, r) < BOUND[dtype]
    assert torch.allclose(got[2].sum(-2).cpu(), torch.ones(T, 4), atol=1e-3)  # columns of comb sum to 1


def test_hc_pre_in_the_prefill_tiles_matches_reference(ops, gen, monkeypatch):
    """The mixes launch in the tile prefill dispatches on a GPU (128-row tiles, 32-deep K steps, K split), over
    two row tiles, the second partial."""
    from deepinfer_cuda_sm100 import dispatch

    real = dispatch.hc_mixes_config
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "num_sms", lambda: 132)
    tile = real(4096, 4 * 4096, 24)
    monkeypatch.undo()
    assert (tile.block_t, tile.block_k) == (128, 32)
    monkeypatch.setattr(dispatch, "hc_mixes_config", lambda *a: tile)
    x, fn, base, scale = _hc_inputs(gen, T=150)
    got = ops.hc_pre(dev(x), HCParams(*dev(fn, base, scale), 20, 1e-6, 1e-6))
    ref = REF.hc_pre(x, HCParams(fn, base, scale, 20, 1e-6, 1e-6))
    for g, r in zip(got, ref, strict=True):
        assert rel_err(g, r) < BOUND[torch.bfloat16]


def test_hc_head_matches_reference(ops, gen):
    x, fn, base, scale = _hc_inputs(gen)
    fn, base, scale = fn[:4], base[:4], scale[:1]
    got = ops.hc_head(dev(x), HCParams(*dev(fn, base, scale), 0, 1e-6, 1e-6))
    assert rel_err(got, REF.hc_head(x, HCParams(fn, base, scale, 0, 1e-6, 1e-6))) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hc_post_matches_reference(ops, gen, dtype):
    y = rand(gen, 5, 48, dtype=dtype)
    res = rand(gen, 5, 4, 48, dtype=dtype)
    post = rand(gen, 5, 4).sigmoid() * 2
    comb = rand(gen, 5, 4, 4).softmax(-1)
    got = ops.hc_post(*dev(y, res, post, comb))
    assert rel_err(got, REF.hc_post(y, res, post, comb)) < BOUND[dtype]


def _count_boundary_launches(monkeypatch) -> list:
    from deepinfer_cuda_sm100.kernels import mhc_boundary

    launches = []
    for name in ("_hc_boundary_mix_kernel", "_hc_collapse_norm_kernel"):
        monkeypatch.setattr(mhc_boundary, name, Counting(getattr(mhc_boundary, name), launches))
    return launches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, N, D", [(1, 4, 200), (2, 4, 48), (1, 3, 48), (3, 4, 48)])
def test_hc_pre_norm_matches_reference(ops, gen, monkeypatch, dtype, T, N, D):
    """Two launches (``T <= 2``; several channel blocks a token in each) or the separate ops (3 tokens),
    against the reference's ``hc_pre`` then ``rms_norm``; 3 streams pad the ``[N, N]`` tiles."""
    from deepinfer_cuda_sm100 import dispatch

    x, fn, base, scale = _hc_inputs(gen, T=T, N=N, D=D, dtype=dtype)
    w = rand(gen, D).abs() + 0.5
    cfg = dispatch.hc_fused_config(T, N, D, fn.shape[0])
    assert (cfg is None) == (T > dispatch.HC_FUSED_MAX_TOKENS)
    assert cfg is None or D > cfg.block_d  # several programs a token
    launches = _count_boundary_launches(monkeypatch)
    got = ops.hc_pre_norm(dev(x), HCParams(*dev(fn, base, scale), 20, 1e-6, 1e-6), dev(w))
    ref = compose_hc_pre_norm(REF, x, HCParams(fn, base, scale, 20, 1e-6, 1e-6), w)
    assert len(launches) == (0 if cfg is None else 2)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert rel_err(g, r) < BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T, D", [(1, 200), (2, 48), (3, 48)])
def test_hc_post_pre_matches_reference(ops, gen, monkeypatch, dtype, T, D):
    """``hc_post`` then the next sublayer's ``hc_pre_norm``: the new streams, the normed collapse, its gates."""
    y, res = rand(gen, T, D, dtype=dtype), rand(gen, T, 4, D, dtype=dtype)
    post, comb = rand(gen, T, 4).sigmoid() * 2, rand(gen, T, 4, 4).softmax(-1)
    _, fn, base, scale = _hc_inputs(gen, T=T, D=D, dtype=dtype)
    w = rand(gen, D).abs() + 0.5
    launches = _count_boundary_launches(monkeypatch)
    got = ops.hc_post_pre(*dev(y, res, post, comb), HCParams(*dev(fn, base, scale), 20, 1e-6, 1e-6), dev(w))
    assert len(launches) == (2 if T <= 2 else 0)
    ref = compose_hc_post_pre(REF, y, res, post, comb, HCParams(fn, base, scale, 20, 1e-6, 1e-6), w)
    assert len(got) == 4
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert rel_err(g, r) < BOUND[dtype]
    # the streams are what hc_post returns (the same expression, rounded once; a GPU may order the 4-term sum
    # differently in the two kernels' layouts)
    alone = ops.hc_post(*dev(y, res, post, comb))
    assert torch.equal(got[0], alone) if INTERPRETED else rel_err(got[0], alone) < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("post", [False, True], ids=["site", "post_site"])
@pytest.mark.parametrize("T, D", [(1, 200), (2, 48), (3, 48)])
def test_v41_hc_site_norm_matches_reference(ops, gen, monkeypatch, dtype, post, T, D):
    """V4.1's single-pass site entry (plugin API 2.6), alone (``hc_site_norm``) or after a sublayer's exit
    (``hc_post_site_norm``): the two boundary launches up to ``HC_FUSED_MAX_TOKENS`` tokens (the collapse by the
    given ``pre``; the site's own ``pre``, ``post`` and ``comb`` by ``_hc_coeffs_kernel``), else the separate ops;
    against the reference's ``hc_post``, ``hc_mixes``, ``hc_collapse`` and ``rms_norm``."""
    y, res = rand(gen, T, D, dtype=dtype), rand(gen, T, 4, D, dtype=dtype)
    post_in, comb_in = rand(gen, T, 4).sigmoid() * 2, rand(gen, T, 4, 4).softmax(-1)
    _, fn, base, scale = _hc_inputs(gen, T=T, D=D, dtype=dtype)
    pre = torch.rand(T, 4, generator=gen) + 0.25  # the site before's
    w = rand(gen, D).abs() + 0.5
    hc, hc_dev = HCParams(fn, base, scale, 20, 1e-6, 1e-6), HCParams(*dev(fn, base, scale), 20, 1e-6, 1e-6)
    launches = _count_boundary_launches(monkeypatch)
    if post:
        got = ops.hc_post_site_norm(*dev(y, res, post_in, comb_in), hc_dev, *dev(pre, w))
        ref = compose_hc_post_site_norm(REF, y, res, post_in, comb_in, hc, pre, w)
    else:
        got = ops.hc_site_norm(dev(res), hc_dev, *dev(pre, w))
        ref = compose_hc_site_norm(REF, res, hc, pre, w)
    assert len(launches) == (2 if T <= 2 else 0)
    assert len(got) == len(ref) == (5 if post else 4)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert rel_err(g, r) < BOUND[dtype]
    # the site's own pre is not the one it collapsed with (a kernel that mixed them up fails here)
    own_pre = got[2 if post else 1].cpu()
    assert rel_err(own_pre, pre) > 10 * BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("post", [False, True], ids=["entry", "post_entry"])
@pytest.mark.parametrize("model", ["v4", "v41"])
@pytest.mark.parametrize("T", [1, 2])
def test_boundary_coefficients_on_the_side_stream_are_the_bytes_in_line(
    ops, gen, monkeypatch, dtype, post, model, T
):
    """``settings.hc_side_coeffs``: a fused boundary's coefficients (``post`` and ``comb``; V4.1's site its own
    ``pre`` too) by ``_hc_coeffs_kernel`` forked before the collapse (on a side stream on a GPU) give byte for byte
    what the same kernel after the collapse on the current stream gives, on a GPU too (coefficients inside the
    collapse differed there in the last bit: NOTES.md v35); the next boundary reads them as its inputs, and both
    entries are the reference's. Each boundary is three launches in either order."""
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.kernels import mhc, mhc_boundary

    D = 200
    y, res = rand(gen, T, D, dtype=dtype), rand(gen, T, 4, D, dtype=dtype)
    post_in, comb_in = rand(gen, T, 4).sigmoid() * 2, rand(gen, T, 4, 4).softmax(-1)
    _, fn, base, scale = _hc_inputs(gen, T=T, D=D, dtype=dtype)
    pre, w = torch.rand(T, 4, generator=gen) + 0.25, rand(gen, D).abs() + 0.5
    hc = HCParams(*dev(fn, base, scale), 20, 1e-6, 1e-6)
    order = []
    for tag, module, name in (("mix", mhc_boundary, "_hc_boundary_mix_kernel"), ("coeffs", mhc, "_hc_coeffs_kernel"),
                              ("collapse", mhc_boundary, "_hc_collapse_norm_kernel")):  # fmt: skip
        monkeypatch.setattr(module, name, Counting(getattr(module, name), order, tag))

    def entry_then_next(side: bool):
        active = settings.active()
        settings.use(settings.CudaSM100Settings(hc_side_coeffs=side))
        try:
            if model == "v4":
                if post:
                    h, x, p, c = ops.hc_post_pre(*dev(y, res, post_in, comb_in), hc, dev(w))
                else:
                    h, (x, p, c) = dev(res), ops.hc_pre_norm(dev(res), hc, dev(w))
                own = ()
                nxt = ops.hc_post_pre(x, h, p, c, hc, dev(w))  # reads post and comb as its inputs
            else:
                if post:
                    h, x, own, p, c = ops.hc_post_site_norm(*dev(y, res, post_in, comb_in), hc, *dev(pre, w))
                else:
                    h, (x, own, p, c) = dev(res), ops.hc_site_norm(dev(res), hc, *dev(pre, w))
                # the next site reads the coefficients as its inputs
                nxt = ops.hc_post_site_norm(x, h, p, c, hc, own, dev(w))
                own = (own,)
            return [t.cpu() for t in (x, *own, p, c, *nxt)]
        finally:
            settings.use(active)

    in_line = entry_then_next(False)
    assert order == ["mix", "collapse", "coeffs"] * 2
    order.clear()
    beside = entry_then_next(True)
    assert order == ["mix", "coeffs", "collapse"] * 2
    for g, r in zip(beside, in_line, strict=True):
        assert g.dtype == r.dtype and torch.equal(g, r)
    ref_hc = HCParams(fn, base, scale, 20, 1e-6, 1e-6)
    if model == "v4":
        ref = (compose_hc_post_pre(REF, y, res, post_in, comb_in, ref_hc, w)[1:] if post
               else compose_hc_pre_norm(REF, res, ref_hc, w))  # fmt: skip
    else:
        ref = (compose_hc_post_site_norm(REF, y, res, post_in, comb_in, ref_hc, pre, w)[1:] if post
               else compose_hc_site_norm(REF, res, ref_hc, pre, w))  # fmt: skip
        # the site's own pre, not the one it collapsed with
        assert rel_err(in_line[1], pre) > 10 * BOUND[dtype]
    for g, r in zip(beside, ref):
        assert g.shape == r.shape and rel_err(g, r) < BOUND[dtype]


@pytest.mark.parametrize("rows", [1, 3])
def test_linear_f32_reads_bf16_activations(ops, gen, monkeypatch, rows):
    """The MoE router: bf16 activations and a float32 weight give the same floats as the cast then ``linear``
    (one row: the GEMV widens as it loads, with no cast launch; more rows: the default cast)."""
    from deepinfer_cuda_sm100 import dispatch

    x, w = rand(gen, rows, 96, dtype=torch.bfloat16), rand(gen, 40, 96, scale=0.1)
    x, w = dev(x, w)
    casts = []
    real_float = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda t: casts.append(t.shape) or real_float(t))
    got = ops.linear_f32(x, w)
    monkeypatch.setattr(torch.Tensor, "float", real_float)
    assert got.dtype == torch.float32 and got.shape == (rows, 40)
    assert (casts == []) == dispatch.plain_gemv(rows, torch.float32, w)
    assert torch.equal(got, ops.linear(x.float(), w))
    assert rel_err(got, x.float().cpu() @ w.cpu().T) < 1e-5


def _weight(gen, fmt, out_f, in_f):
    w = rand(gen, out_f, in_f, scale=0.1)
    if fmt == "fp8_block":
        return quantize_fp8_block(w, "ue8m0")
    if fmt == "fp8_block32":  # V4.1: one ue8m0 scale per 32 x 32 block
        return quantize_fp8_block(w, "ue8m0", block=32)
    if fmt == "fp4_e2m1":
        return quantize_fp4_e2m1(w)
    return w.to(torch.bfloat16)


def _to_dev(w):
    from deepinfer_core.testing.kit import to_device

    return to_device(w, torch.device(dev(torch.zeros(1)).device))


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_block32", "fp4_e2m1"])
@pytest.mark.parametrize("rows", [1, 2, 7])
def test_quantized_linear_dequantizes_in_kernel(ops, gen, gemm_kind, fmt, rows):
    # 160 outputs: a partial 128-row FP8 scale block; 192 inputs: a partial K tile; 1-2 rows: decode tiles.
    x = rand(gen, rows, 192, dtype=torch.bfloat16)
    w = _weight(gen, fmt, 160, 192)
    got = ops.linear(dev(x), _to_dev(w))
    assert got.shape == (rows, 160) and got.dtype == torch.bfloat16
    assert rel_err(got, REF.linear(x, w)) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                             (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)])  # fmt: skip
@pytest.mark.parametrize("rows", [1, 3])
def test_plain_linear_of_one_row_is_the_gemv(ops, gen, x_dtype, w_dtype, rows, monkeypatch):
    """A plain weight's ``linear`` of one row (the MoE gate at decode: float32 x float32) runs the Triton GEMV,
    with split-K; more rows, or a weight the activation's dtype would round, stay ``x @ w.T``. K = 200: a
    partial step."""
    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

    launches = []
    real = gg.grouped_gemm
    monkeypatch.setattr(gg, "grouped_gemm", lambda *a, **k: launches.append(a[4]) or real(*a, **k))
    x = rand(gen, rows, 200, dtype=x_dtype)
    w = rand(gen, 160, 200, scale=0.1).to(w_dtype)
    got = ops.linear(*dev(x, w))
    assert got.dtype == x_dtype and got.shape == (rows, 160)
    assert rel_err(got, REF.linear(x, w)) < BOUND[x_dtype]
    gemv = rows == 1 and (w_dtype == x_dtype or w_dtype == torch.bfloat16)
    assert [c.gemv for c in launches] == ([True] if gemv else [])
    monkeypatch.setattr(dispatch, "PLAIN_GEMV_MAX_BYTES", w.numel() * w.element_size() - 1)
    assert not dispatch.plain_gemv(1, w_dtype, w), "the head stays on cuBLAS"


@pytest.mark.parametrize("fmt", ["plain", "fp8_block", "fp8_block32", "fp4_e2m1"])
@pytest.mark.parametrize("limit", [0.0, 0.5])
def test_swiglu_mlp_matches_reference(ops, gen, gemm_kind, fmt, limit):
    x = rand(gen, 9, 128, dtype=torch.bfloat16)
    w1, w3 = _weight(gen, fmt, 96, 128), _weight(gen, fmt, 96, 128)
    w2 = _weight(gen, fmt, 128, 96 if fmt != "fp4_e2m1" else 96)
    got = ops.swiglu_mlp(dev(x), *(_to_dev(w) for w in (w1, w3, w2)), limit)
    assert rel_err(got, REF.swiglu_mlp(x, w1, w3, w2, limit)) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_block32", "fp4_e2m1"])
def test_linear_and_mlp_with_split_k_match_reference(ops, gen, gemm_kind, fmt, monkeypatch):
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch

    orig = dispatch.gemm_config
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: replace(orig(*a, **k), split_k=4))
    # K = 320: three slices of two 64-wide steps, the last one partial
    x = rand(gen, 3, 320, dtype=torch.bfloat16)
    w = _weight(gen, fmt, 160, 320)
    assert rel_err(ops.linear(dev(x), _to_dev(w)), REF.linear(x, w)) < BOUND[torch.bfloat16]
    w1, w3, w2 = _weight(gen, fmt, 128, 320), _weight(gen, fmt, 128, 320), _weight(gen, fmt, 320, 128)
    got = ops.swiglu_mlp(dev(x), *(_to_dev(v) for v in (w1, w3, w2)), 0.5)
    assert rel_err(got, REF.swiglu_mlp(x, w1, w3, w2, 0.5)) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("fmt", ["plain", "fp8_block32", "fp4_e2m1"])
@pytest.mark.parametrize(
    "split, dtype, rows",
    [
        ("whole_k", torch.float32, 1),
        ("whole_k", torch.bfloat16, 1),
        ("whole_k", torch.bfloat16, 3),
        ("split_k", torch.bfloat16, 3),
        ("split_finish", torch.bfloat16, 1),
    ],
)
def test_swiglu_mlp_add_is_the_mlp_then_the_add(ops, gen, gemm_kind, fmt, rows, split, dtype, monkeypatch):
    """The shared expert with the routed output added in its down projection's epilogue (``swiglu_mlp_add``)
    equals this backend's ``swiglu_mlp`` followed by a torch add, bit for bit: the epilogue rounds the GEMM's
    result to the output dtype, then adds and rounds again, as the two ops do. Whole K, split K finished by a
    second launch, and split K finished by the last slice; and the reference's composition to its bound."""
    from dataclasses import replace

    from deepinfer_core.ops.compose import compose_swiglu_mlp_add
    from deepinfer_cuda_sm100 import dispatch, settings

    if split != "whole_k":
        orig = dispatch.gemm_config
        monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: replace(orig(*a, **k), split_k=3))
        settings.use(settings.CudaSM100Settings(splitk_finish=split == "split_finish"))
    x = rand(gen, rows, 320, dtype=dtype)
    w1, w3, w2 = _weight(gen, fmt, 128, 320), _weight(gen, fmt, 128, 320), _weight(gen, fmt, 320, 128)
    add = rand(gen, rows, 320, dtype=dtype, scale=2.0)
    ws = [_to_dev(v) for v in (w1, w3, w2)]
    got = ops.swiglu_mlp_add(dev(x), *ws, 0.5, dev(add))
    assert got.dtype == dtype and got.shape == (rows, 320)
    assert torch.equal(got, ops.swiglu_mlp(dev(x), *ws, 0.5) + dev(add))
    want = compose_swiglu_mlp_add(REF, x, w1, w3, w2, 0.5, add)
    assert rel_err(got, want) < BOUND[dtype]


def test_swiglu_mlp_add_refuses_an_add_of_another_shape(ops, gen):
    w1, w3, w2 = (_to_dev(_weight(gen, "plain", *shape)) for shape in ((32, 64), (32, 64), (64, 32)))
    x = dev(rand(gen, 2, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="add is"):
        ops.swiglu_mlp_add(x, w1, w3, w2, 0.0, dev(rand(gen, 2, 32, dtype=torch.bfloat16)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_grouped_linear_beyond_decode_sizes_keeps_a_gemm_per_group(ops, gen, monkeypatch, dtype):
    """Plain weights take the grouped GEMM up to ``PLAIN_GROUPED_MAX_TOKENS`` rows only (a prefill chunk keeps
    one cuBLAS GEMM per group); both equal the reference, float32 activations over BF16 weights included."""
    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

    launches = []
    real = gg.grouped_gemm
    monkeypatch.setattr(gg, "grouped_gemm", lambda *a, **k: launches.append(1) or real(*a, **k))
    ws = [rand(gen, 40, 64, scale=0.1).to(torch.bfloat16) for _ in range(3)]
    for rows in (dispatch.PLAIN_GROUPED_MAX_TOKENS, dispatch.PLAIN_GROUPED_MAX_TOKENS + 1):
        launches.clear()
        x = rand(gen, rows, 3, 64, dtype=dtype)
        got = ops.grouped_linear(dev(x), [dev(w) for w in ws])
        assert len(launches) == (1 if rows <= dispatch.PLAIN_GROUPED_MAX_TOKENS else 0)
        assert got.dtype == dtype and rel_err(got, REF.grouped_linear(x, ws)) < BOUND[dtype]


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_block32", "fp4_e2m1", "plain"])
@pytest.mark.parametrize("rows", [1, 9])
def test_grouped_linear_is_one_gemm_matching_the_reference(ops, gen, gemm_kind, fmt, rows, monkeypatch):
    """Four groups, each its own weight (V4's wo_a has 8), through one grouped GEMM, with and without split-K;
    ``plain``: BF16 weights (V4.1's dequantised wo_a groups) at decode sizes."""
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

    launches = []
    real = gg.grouped_gemm
    monkeypatch.setattr(gg, "grouped_gemm", lambda *a, **k: launches.append(1) or real(*a, **k))
    x = rand(gen, rows, 4, 128, dtype=torch.bfloat16)
    ws = [_weight(gen, fmt, 48, 128) for _ in range(4)]
    want = REF.grouped_linear(x, ws)
    got = ops.grouped_linear(dev(x), [_to_dev(w) for w in ws])
    assert got.shape == (rows, 4, 48) and got.dtype == torch.bfloat16 and len(launches) == 1
    assert rel_err(got, want) < BOUND[torch.bfloat16]
    for g in (0, 3):  # each group used its own weight
        assert rel_err(got[:, g], REF.linear(x[:, g].contiguous(), ws[g])) < BOUND[torch.bfloat16]
    orig = dispatch.gemm_config
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: replace(orig(*a, **k), split_k=3))
    empty = torch.empty  # the split-K workspace is not zeroed (every row is tiled): NaN where nothing writes

    def nan_empty(*a, **k):
        t = empty(*a, **k)
        return t.fill_(float("nan")) if t.dtype == torch.float32 else t

    monkeypatch.setattr(gg.torch, "empty", nan_empty)
    assert rel_err(ops.grouped_linear(dev(x), [_to_dev(w) for w in ws]), want) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("fmt", ["plain", "fp8_block", "fp8_block32", "fp4_e2m1"])
@pytest.mark.parametrize("block_k,split_k", [(256, 1), (128, 3)])
def test_one_row_gemv_with_whole_scale_blocks(ops, gen, fmt, block_k, split_k, monkeypatch):
    """The decode GEMV's unmasked path (K whole steps, N whole blocks; FP8 steps spanning several 128-wide scale
    blocks), gated (SwiGLU) and not, with and without split-K; against the reference, and beside N with a
    partial block (the masked path)."""
    from deepinfer_cuda_sm100 import dispatch

    cfg = dispatch.GemmConfig(1, 16, block_k, 4, 1, split_k=split_k, gemv=True)
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: cfg)
    x = rand(gen, 1, 768, dtype=torch.bfloat16)
    for n in (256, 144):
        w = _weight(gen, fmt, n, 768)
        assert rel_err(ops.linear(dev(x), _to_dev(w)), REF.linear(x, w)) < BOUND[torch.bfloat16], n
    w1, w3, w2 = _weight(gen, fmt, 256, 768), _weight(gen, fmt, 256, 768), _weight(gen, fmt, 768, 256)
    got = ops.swiglu_mlp(dev(x), *(_to_dev(v) for v in (w1, w3, w2)), 0.5)
    assert rel_err(got, REF.swiglu_mlp(x, w1, w3, w2, 0.5)) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("scale", [1e-6, 1.0, 3e4])
def test_one_row_fp4_gemv_in_float16_pairs(ops, gen, split_k, scale, monkeypatch):
    """One-row FP4 tiles with bf16 activations take the float16 pair path (``FP4_H2``; emulated here, the PTX
    runs on a GPU): against the reference and the float32 path, for activations whose magnitudes float16 could
    not hold unscaled (tiny, large, one outlier), gated and not, with and without split-K."""
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch

    cfg = dispatch.GemmConfig(1, 16, 128, 4, 1, split_k=split_k, gemv=True)
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: cfg)
    modes = []
    real_mode = dispatch.fp4_h2_mode
    monkeypatch.setattr(dispatch, "fp4_h2_mode", lambda *a: modes.append(real_mode(*a)) or modes[-1])
    x = rand(gen, 1, 768, scale=scale)
    x[0, 5] *= 300.0  # an outlier far above the rest
    x = x.to(torch.bfloat16)
    w = _weight(gen, "fp4_e2m1", 256, 768)
    want = REF.linear(x, w)
    got = ops.linear(dev(x), _to_dev(w))
    assert modes == [1 if INTERPRETED else 2]  # emulated here, PTX on a GPU
    assert rel_err(got, want) < BOUND[torch.bfloat16]
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: replace(cfg, fp4_h2=False))
    exact = ops.linear(dev(x), _to_dev(w))
    assert modes[-1] == 0
    assert rel_err(got, exact) < 4e-3  # float16 lane sums against float32 FMAs: bf16's own rounding
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: cfg)
    w1, w3, w2 = (_weight(gen, "fp4_e2m1", o, i) for o, i in ((256, 768), (256, 768), (768, 256)))
    got = ops.swiglu_mlp(dev(x), *(_to_dev(v) for v in (w1, w3, w2)), 0.0)
    assert rel_err(got, REF.swiglu_mlp(x, w1, w3, w2, 0.0)) < BOUND[torch.bfloat16]
    assert modes[-2:] == [modes[0]] * 2  # gate+up and down


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted,heads,d", [(False, 5, 48), (True, 1, 40)])
def test_rms_norm_rope_is_the_two_ops(ops, gen, dtype, weighted, heads, d):
    """One launch for V4's query heads (unweighted) and KV row (weighted): equal to RMSNorm then RoPE (the
    norm rounded to the dtype in between), also on a row-strided view (a slice of a fused projection)."""
    x = rand(gen, 7, heads, d + 8, scale=3.0, dtype=dtype)[..., :d]
    w = rand(gen, d).abs() + 0.5 if weighted else None
    pos, freq = (
        torch.randint(0, 5000, (7,), generator=gen),
        1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16),
    )
    got = ops.rms_norm_rope(*dev(x, w), 1e-6, *dev(pos, freq)).cpu()
    want = REF.rope(REF.rms_norm(x, w, 1e-6), pos, freq)
    assert got.dtype == dtype and got.shape == x.shape
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else BOUND[dtype])
    two = ops.rope(ops.rms_norm(*dev(x, w), 1e-6), *dev(pos, freq)).cpu()
    assert rel_err(got, two) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 6])
def test_fp8_block32_weights_run_in_the_grouped_gemm(ops, gen, gemm_kind, dtype, rows, monkeypatch):
    """V4.1's ``fp8_block32`` weights with float32 scales (here not powers of two, which the bf16 tile cannot
    hold exactly: the harder case than the checkpoint's ue8m0 scales) and ragged shapes (partial 32 x 32 blocks in both dimensions): ``linear``, ``grouped_linear`` and ``swiglu_mlp``
    each launch the grouped GEMM (one per projection) and equal the reference ops on the same stored weights."""
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

    launches = []
    real = gg.grouped_gemm
    monkeypatch.setattr(
        gg, "grouped_gemm", lambda *a, **k: launches.append(a[1].scale_block) or real(*a, **k)
    )
    w1, w3 = (quantize_fp8_block(rand(gen, 70, 45), block=32) for _ in range(2))
    w2 = quantize_fp8_block(rand(gen, 45, 70), block=32)
    assert w1.format == "fp8_block32" and not torch.equal(w1.scale, torch.exp2(torch.log2(w1.scale).round()))
    x = rand(gen, rows, 45, dtype=dtype)
    got = ops.linear(dev(x), _on_dev(w1))
    assert rel_err(got, REF.linear(x, w1)) < BOUND[dtype]
    want = REF.swiglu_mlp(x, w1, w3, w2, 10.0)
    assert rel_err(ops.swiglu_mlp(dev(x), _on_dev(w1), _on_dev(w3), _on_dev(w2), 10.0), want) < BOUND[dtype]
    groups = rand(gen, rows, 2, 45, dtype=dtype)
    got = ops.grouped_linear(dev(groups), [_on_dev(w1), _on_dev(w3)])
    assert rel_err(got, REF.grouped_linear(groups, [w1, w3])) < BOUND[dtype]
    assert launches == [32] * 4  # linear, swiglu (gate+up, down), grouped_linear: no torch fallback


def _on_dev(w):
    from dataclasses import replace

    data, scale = dev(w.data, w.scale)
    return replace(w, data=data, scale=scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 11])
def test_v41_hc_mixes_and_collapse_match_reference(ops, gen, dtype, T):
    """V4.1's single-pass mHC on all tokens at once (two launches, then one for the collapse) against the
    reference, which computes one token at a time: ``pre``, ``post`` and the Sinkhorn ``comb``, and the
    collapse with another site's ``pre``."""
    x, fn, base, scale = _hc_inputs(gen, T=T, dtype=dtype)
    hc = HCParams(fn, base, scale, 20, 1e-6, 1e-6)
    got = ops.hc_mixes(dev(x), HCParams(*dev(fn, base, scale), 20, 1e-6, 1e-6))
    ref = REF.hc_mixes(x, hc)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == torch.float32 and g.shape == r.shape
        assert rel_err(g, r) < BOUND[torch.float32] * (1 if dtype == torch.float32 else 10)
    pre = rand(gen, T, 4).sigmoid()
    out = ops.hc_collapse(*dev(x, pre))
    assert out.dtype == dtype
    assert rel_err(out, REF.hc_collapse(x, pre)) < BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [48, 2100])
def test_v41_engram_gate_runs_all_rows_as_the_reference_runs_each(ops, gen, dtype, D):
    """The one-launch gate (``kernels/engram.py``) against the reference, which runs each token alone: rows of
    one partial chunk and of two chunks (2,048 a chunk), one row of zeros (gate ``sigmoid(1e-3)``: the floor),
    and a key read through a stride, as the model slices it out of ``wkv``'s output. (The conformance case
    ``dense.engram_gate[hc4_tiny_and_zero_rows]`` adds a row whose dot products sit under the floor.)"""
    h, value, weight = rand(gen, 7, 4, D, dtype=dtype), rand(gen, 7, D, dtype=dtype), rand(gen, 4, D)
    key = rand(gen, 7, 5 * D, dtype=dtype)[:, : 4 * D].view(7, 4, D)
    h[5], key[5] = 0.0, 0.0
    got = ops.engram_gate(*dev(h, key, value, weight), 1e-6)
    assert got.dtype == dtype
    assert rel_err(got, REF.engram_gate(h, key, value, weight, 1e-6)) < BOUND[dtype]
    floor = (torch.sigmoid(torch.tensor(1e-3)) * value[5].float()).expand(4, D)
    assert torch.allclose(got[5].cpu().float(), floor, rtol=2**-7 if dtype != torch.float32 else 1e-6, atol=0)
