"""DeepSeek-V4.1's activation quantisers equal the reference's bit for bit on the committed goldens
(``tests/data/v41/quantisers.safetensors``: normal rows from 1e-6 to 1e3 and edge rows: zeros, values below
the clamps, e2m1 and e4m3 midpoints, negative zeros, values that round to -0)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepinfer_core.ops.kv_quant import (
    dequantize_fp4,
    dequantize_fp8,
    e2m1_codes,
    fp4_roundtrip,
    quantize_fp4,
    quantize_fp8,
)
from deepinfer_core.ops.quant_formats import dequant, quantize_fp8_block

GOLDENS = Path(__file__).resolve().parents[1] / "data" / "v41" / "quantisers.safetensors"


@pytest.fixture(scope="module")
def goldens() -> dict[str, torch.Tensor]:
    return load_file(str(GOLDENS))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_fp8_window_codes_scales_and_values_equal_the_reference(goldens):
    codes, scales = quantize_fp8(goldens["input"], 32)
    assert torch.equal(_bytes(codes), _bytes(goldens["fp8_window.data"]))
    assert torch.equal(_bytes(scales), _bytes(goldens["fp8_window.scale"]))
    assert torch.equal(dequantize_fp8(codes, scales, 32), goldens["fp8_window.roundtrip"])


@pytest.mark.parametrize("name,block,scale", [("fp4_index", 32, "ue8m0"), ("fp4_ckv", 16, "e4m3")])
def test_fp4_packed_bytes_scales_and_values_equal_the_reference(goldens, name, block, scale):
    packed, scales = quantize_fp4(goldens["input"], block, scale)
    assert torch.equal(packed, goldens[f"{name}.packed"])
    assert torch.equal(_bytes(scales), _bytes(goldens[f"{name}.scale"]))
    values = dequantize_fp4(packed, scales, block)
    assert torch.equal(values, goldens[f"{name}.roundtrip"])
    assert torch.equal(values.signbit(), goldens[f"{name}.roundtrip"].signbit())  # -0.0 stays -0.0
    assert torch.equal(fp4_roundtrip(goldens["input"], block, scale), values)


def test_e2m1_ties_take_the_even_code_and_negative_zero_keeps_its_sign():
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, -0.2, 0.26, 6.0])
    assert e2m1_codes(v).tolist() == [0, 2, 2, 4, 4, 6, 6, 8, 8, 1, 7]


def test_fp8_32x32_block_weights_dequantise_per_32_block():
    w = torch.randn(70, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 96)
    q = quantize_fp8_block(w, "ue8m0", block=32)
    assert q.format == "fp8_block32" and q.scale.shape == (3, 3)
    expect = q.data.float() * q.scale.repeat_interleave(32, 0)[:70].repeat_interleave(32, 1)[:, :96]
    assert torch.equal(dequant(q), expect)
    assert (dequant(q) - w).abs().max() <= (w.abs().max() / 8)


def test_fp4_e4m3_scale_saturates_at_448_whatever_torch_casts():
    """A block whose amax / 6 passes e4m3's largest value (448) gets the scale 448 and clamped codes, not a NaN
    scale: torch's own float32 -> float8_e4m3fn cast of such values differs between versions."""
    x = torch.tensor([[3125.78, -100.0, 2000.0, 0.5] + [0.0] * 12])
    packed, scales = quantize_fp4(x, 16, "e4m3")
    assert scales.float().flatten().tolist() == [448.0]
    values = dequantize_fp4(packed, scales, 16)
    assert values[0, :4].tolist() == [6 * 448.0, 0.0, 4 * 448.0, 0.0]  # codes x / 448, nearest e2m1
