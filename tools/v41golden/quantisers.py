"""Bit-exact goldens of the reference's KV and indexer quantisers on fixed inputs.

The three calls are made exactly as ``model.py`` makes them (its module globals give the block sizes and the
scale format), both in place (the quantise-dequantise round trip the model computes with) and returning the
stored form:

- ``fp8_window``: ``act_quant(x, 32, "ue8m0", float8_e8m0fnu)``, the window KV (and every GEMM input):
  ``data`` F8_E4M3, ``scale`` F8_E8M0 ``[rows, 128/32]``;
- ``fp4_index``: ``fp4_act_quant(x, 32)``, the index keys and queries: ``packed`` U8 ``[rows, 64]`` (element
  ``2i`` in the low nibble), ``scale`` F8_E8M0 ``[rows, 4]``;
- ``fp4_ckv``: ``fp4_act_quant(x, 16, scale_dtype=float8_e4m3fn)``, the compressed KV: ``packed`` U8,
  ``scale`` F8_E4M3 ``[rows, 8]``.

Each also has ``roundtrip`` (float32, the in-place result). ``input`` ``[rows, 128]`` float32 mixes normal rows
of magnitudes from 1e-6 to 1e3 with rows built to hit the rules' edges: all zeros, amax under the clamps,
values exactly on rounding midpoints of the E4M3 and E2M1 grids, negative zeros and values that round to zero
from below (their FP4 code keeps the sign bit).
"""

from __future__ import annotations

import torch

ROWS, WIDTH = 48, 128
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _edge_rows() -> torch.Tensor:
    rows = torch.zeros(8, WIDTH)
    rows[1] = torch.linspace(-1e-7, 1e-7, WIDTH)  # under the FP8 clamp (1e-4) and the E4M3-scale FP4 clamp
    mids = torch.tensor(E2M1_MIDPOINTS * 4 + (6.0,) * 4)  # 32 values: amax 6 makes the ue8m0 scale exactly 1
    rows[2] = torch.cat([mids, -mids, mids * 4, -mids / 8])
    e4m3_mids = torch.tensor(
        [1.0625, 1.1875, 1.3125, 3.125, 6.25, 13.5, 27.0, 448.0]
    )  # halfway between codes
    rows[3] = e4m3_mids.repeat(WIDTH // 8) * torch.tensor([1.0, -1.0]).repeat_interleave(4).repeat(WIDTH // 8)
    rows[4] = -torch.rand(WIDTH, generator=torch.Generator().manual_seed(4)) * 0.04  # round to -0 in FP4
    rows[4, ::32] = -6.0
    rows[5] = -0.0
    rows[6] = torch.full((WIDTH,), 2.0**-20)
    rows[7] = torch.arange(WIDTH, dtype=torch.float32) - WIDTH / 2
    return rows


def inputs(seed: int = 2024) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = ROWS - 8
    magnitude = 10.0 ** torch.linspace(-6, 3, n).unsqueeze(-1)
    normal = torch.randn(n, WIDTH, generator=g) * magnitude
    return torch.cat([normal, _edge_rows()])


def goldens(ref, x: torch.Tensor) -> dict[str, torch.Tensor]:
    m = ref.model
    out = {"input": x}
    q, s = m.act_quant(x.clone(), m.fp8_block_size, m.scale_fmt, m.scale_dtype)
    out.update({"fp8_window.data": q, "fp8_window.scale": s})
    out["fp8_window.roundtrip"] = m.act_quant(x.clone(), m.fp8_block_size, m.scale_fmt, m.scale_dtype, True)
    for name, block, kw in (
        ("fp4_index", m.fp4_block_size, {}),
        ("fp4_ckv", 16, {"scale_dtype": torch.float8_e4m3fn}),
    ):
        packed, scale = m.fp4_act_quant(x.clone(), block, **kw)
        out[f"{name}.packed"] = packed.view(torch.uint8)
        out[f"{name}.scale"] = scale
        out[f"{name}.roundtrip"] = m.fp4_act_quant(x.clone(), block, True, **kw)
    return out
