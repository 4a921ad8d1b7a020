"""FP8 block and FP4 e2m1 weight formats: error bounds, scale formats, packing order, storage round trips."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepinfer_core.ops.quant_formats import (
    E2M1_VALUES,
    dequant,
    dequant_rows,
    fp4_data_to_uint8,
    quantize_fp4_e2m1,
    quantize_fp8_block,
)

G = torch.Generator().manual_seed(2)


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_fp8_block_error_is_within_half_an_e4m3_step_of_each_block(scale_fmt):
    w = torch.randn(300, 200, generator=G) * torch.logspace(-2, 1, 200)  # ragged blocks, varied ranges
    q = quantize_fp8_block(w, scale_fmt)
    assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == (300, 200) and q.scale.shape == (3, 2)
    if scale_fmt == "ue8m0":
        assert torch.equal(q.scale, torch.exp2(torch.log2(q.scale).round()))
    err = (dequant(q) - w).abs()
    per_elem_scale = q.scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :200]
    # e4m3: 3 mantissa bits, so rounding moves a value by at most 2^-4 of its magnitude (plus subnormal steps)
    assert (err <= w.abs() * 2**-4 + per_elem_scale * 2**-9 + 1e-12).all()


def test_fp4_represents_grid_values_exactly_and_packs_low_nibble_first():
    grid = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES[1:]) + (0.0,))
    w = grid[torch.randint(0, 16, (4, 64), generator=G)] * 0.25
    w[:, 0], w[:, 32] = 6 * 0.25, -6 * 0.25  # every 32-group spans the full range: scale 0.25
    q = quantize_fp4_e2m1(w)
    assert q.data.dtype == torch.uint8 and q.data.shape == (4, 32) and q.scale.shape == (4, 2)
    assert torch.equal(dequant(q), w)
    row = torch.zeros(1, 32)
    row[0, 0], row[0, 1] = 0.5, 6.0
    assert int(quantize_fp4_e2m1(row).data[0, 0]) == 0x71  # element 0 (code 1) low, element 1 (code 7) high


def test_fp4_error_bound_and_shape_check():
    w = torch.randn(8, 96, generator=G)
    q = quantize_fp4_e2m1(w)
    scale = q.scale.repeat_interleave(32, dim=1)
    assert ((dequant(q) - w).abs() <= scale * 1.0 + 1e-7).all()  # half the widest e2m1 gap (4 -> 6)
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_fp4_e2m1(torch.randn(4, 40))


def test_dequant_rows_are_slices_of_the_full_matrix():
    for q in (
        quantize_fp8_block(torch.randn(260, 70, generator=G)),
        quantize_fp4_e2m1(torch.randn(50, 64, generator=G)),
    ):
        full, start = dequant(q), q.out_features // 2
        assert torch.equal(dequant_rows(q, start, q.out_features), full[start:])


def test_published_storage_dtypes_round_trip(tmp_path):
    q = quantize_fp4_e2m1(torch.randn(6, 64, generator=G))
    save_file(
        {"w": q.data.view(torch.float4_e2m1fn_x2), "s": q.scale.to(torch.float8_e8m0fnu)},
        str(tmp_path / "x.safetensors"),
    )
    back = load_file(str(tmp_path / "x.safetensors"))
    assert torch.equal(fp4_data_to_uint8(back["w"]), q.data)
    assert torch.equal(back["s"].float(), q.scale)  # ue8m0 scales are exact powers of two


def test_concat_rows_fuses_linears_that_share_an_input():
    """One matrix for several linears of one input (decode: one GEMV instead of several): the fused product is
    the products side by side, and the row views are the original weights."""
    from deepinfer_core.ops.reference.dense import ReferenceDenseOps
    from deepinfer_core.ops.weights import concat_rows

    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 256, generator=g)
    ops = ReferenceDenseOps()
    ws = [quantize_fp8_block(torch.randn(n, 256, generator=g) * 0.1, "ue8m0") for n in (256, 128, 96)]
    fused, views = concat_rows(ws)
    want = torch.cat([ops.linear(x, w) for w in ws], dim=-1)
    assert torch.equal(ops.linear(x, fused), want)
    for w, v in zip(ws, views):
        assert torch.equal(v.data, w.data) and torch.equal(v.scale, w.scale) and v.shape == w.shape
        assert v.data.data_ptr() >= fused.data.data_ptr()  # a view: no second copy
    plain = [torch.randn(n, 64, generator=g) for n in (5, 7)]
    fused, views = concat_rows(plain)
    assert fused.shape == (12, 64) and all(torch.equal(a, b) for a, b in zip(plain, views))
    # FP8 row counts off the 128-row scale blocks, mixed formats or dtypes, other input widths: no fusion
    assert (
        concat_rows([quantize_fp8_block(torch.randn(n, 256, generator=g), "ue8m0") for n in (96, 128)])
        is None
    )
    # V4.1's 32 x 32 blocks: 96 rows are whole blocks; a row count off them, or formats mixed, do not fuse
    w32 = [
        quantize_fp8_block(torch.randn(n, 256, generator=g) * 0.1, "ue8m0", block=32) for n in (96, 64, 40)
    ]
    fused, views = concat_rows(w32)
    assert fused.format == "fp8_block32" and fused.scale.shape == (7, 8)
    assert torch.equal(ops.linear(x, fused), torch.cat([ops.linear(x, w) for w in w32], dim=-1))
    for w, v in zip(w32, views):
        assert torch.equal(v.data, w.data) and torch.equal(v.scale, w.scale) and v.shape == w.shape
    assert concat_rows([w32[2], w32[0]]) is None  # 40 rows end inside a block
    assert concat_rows([ws[1], w32[1]]) is None
    assert concat_rows([ws[0], torch.randn(8, 256)]) is None
    assert concat_rows([plain[0], plain[1].double()]) is None
    assert concat_rows([plain[0], torch.randn(5, 32)]) is None


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_dequant_stays_on_the_weights_device(fmt):
    """V4.1 dequantises ``wo_a`` at load time on the weights' device; a CPU result broke the H200 run. The
    ``meta`` device stands in for a GPU here: every intermediate must follow the data."""
    w = torch.randn(64, 64)
    q = quantize_fp8_block(w) if fmt == "fp8" else quantize_fp4_e2m1(w)
    on_meta = dataclasses.replace(q, data=q.data.to("meta"), scale=q.scale.to("meta"))
    assert dequant(on_meta).device.type == "meta"
    assert dequant_rows(on_meta, 0, 32).device.type == "meta"
