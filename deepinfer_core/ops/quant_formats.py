"""Tensor-level weight formats: FP8 e4m3 with 128x128 (V4) or 32x32 (V4.1) block scales and FP4 e2m1 with a
ue8m0 scale per 32.

These are the formats of DeepSeek's published checkpoints (see :class:`deepinfer_core.ops.weights.QuantizedWeight`
for the in-memory layout). Every function here is pure PyTorch and deterministic.

- ``fp8_block``: ``w ~= data.float() * scale`` broadcast over ``128 x 128`` blocks (the last block row / column
  may be partial). ``scale = amax(block) / 448``, rounded *up* to a power of two when ``scale_fmt == "ue8m0"``.
- ``fp8_block32``: the same with ``32 x 32`` blocks (DeepSeek-V4.1).
- ``fp4_e2m1``: ``w ~= e2m1(code) * scale`` with one power-of-two scale per 32 consecutive inputs of a row;
  two 4-bit codes per byte, element ``2j`` in the low nibble. Codes are ``sign << 3 | magnitude`` with
  magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4, 6``.
"""

from __future__ import annotations

from typing import Literal

import torch

from deepinfer_core.ops.weights import FP8_SCALE_ROWS, QuantizedWeight

#: block edge of each FP8 format
FP8_BLOCKS = FP8_SCALE_ROWS
FP8_BLOCK = FP8_BLOCKS["fp8_block"]
FP8_MAX = 448.0
FP4_BLOCK = 32
FP4_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
ScaleFmt = Literal["ue8m0"] | None


def _e2m1_lut(device: torch.device | None = None) -> torch.Tensor:
    """``[16]`` float32: the value of each 4-bit code (codes 8-15 are the negatives)."""
    pos = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([pos, -pos])


def pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ``>= x`` (``x > 0``), as float32: the ue8m0 rounding of a scale."""
    return torch.exp2(torch.ceil(torch.log2(x.float())))


def quantize_fp8_block(
    w: torch.Tensor, scale_fmt: ScaleFmt = None, block: int = FP8_BLOCK
) -> QuantizedWeight:
    """``w [out, in]`` -> FP8 e4m3 data with one float32 scale per ``block x block`` tile (``block`` 128:
    ``fp8_block``, 32: ``fp8_block32``)."""
    fmt = next((f for f, b in FP8_BLOCKS.items() if b == block), None)
    if fmt is None:
        raise ValueError(f"FP8 block size {block} has no format; known: {FP8_BLOCKS}")
    out_f, in_f = w.shape
    rows, cols = -(-out_f // block), -(-in_f // block)
    wf = torch.zeros(rows * block, cols * block, dtype=torch.float32)
    wf[:out_f, :in_f] = w.float()
    tiles = wf.view(rows, block, cols, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / FP8_MAX
    if scale_fmt == "ue8m0":
        scale = pow2_ceil(scale)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    data = q.view(rows * block, cols * block)[:out_f, :in_f].to(torch.float8_e4m3fn).contiguous()
    return QuantizedWeight(data=data, scale=scale.contiguous(), format=fmt, shape=(out_f, in_f))


def quantize_fp4_e2m1(w: torch.Tensor, block: int = FP4_BLOCK) -> QuantizedWeight:
    """``w [out, in]`` (``in % 32 == 0``) -> packed e2m1 codes ``uint8 [out, in/2]`` and ue8m0 scales ``[out, in/32]``."""
    out_f, in_f = w.shape
    if in_f % block:
        raise ValueError(f"fp4_e2m1 needs in_features divisible by {block}, got {in_f}")
    groups = w.float().view(out_f, in_f // block, block)
    scale = pow2_ceil((groups.abs().amax(dim=-1) / FP4_MAX).clamp(min=2.0**-126))
    x = (groups / scale[..., None]).view(out_f, in_f)
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    mid = (mags[1:] + mags[:-1]) / 2
    mag_code = torch.bucketize(x.abs(), mid, right=False)
    code = (mag_code | ((x < 0) & (mag_code > 0)).to(torch.int64) << 3).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return QuantizedWeight(
        data=packed.contiguous(), scale=scale.contiguous(), format="fp4_e2m1", shape=(out_f, in_f)
    )


def dequant_rows(qw: QuantizedWeight, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of the dequantized ``[out, in]`` matrix, float32 (one block row at a time)."""
    if qw.format in FP8_BLOCKS:
        block = FP8_BLOCKS[qw.format]
        data = qw.data[start:stop].float()
        rows = torch.arange(start, stop, device=data.device) // block
        s = qw.scale[rows].repeat_interleave(block, dim=1)[:, : qw.in_features]
        return data * s
    if qw.format == "fp4_e2m1":
        packed = qw.data[start:stop]
        codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).view(stop - start, -1).long()
        vals = _e2m1_lut(packed.device)[codes]
        return vals * qw.scale[start:stop].repeat_interleave(FP4_BLOCK, dim=1)
    raise ValueError(f"unknown quantized format {qw.format!r}")


def dequant(
    qw: QuantizedWeight | torch.Tensor, dtype: torch.dtype = torch.float32, row_block: int = FP8_BLOCK
) -> torch.Tensor:
    """The full ``[out, in]`` matrix in ``dtype``, dequantized block row by block row, on ``qw``'s device. A
    plain tensor (a weight that is not quantized) is returned in ``dtype``."""
    if isinstance(qw, torch.Tensor):
        return qw.to(dtype)
    out = torch.empty(qw.shape, dtype=dtype, device=qw.data.device)
    for start in range(0, qw.out_features, row_block):
        stop = min(start + row_block, qw.out_features)
        out[start:stop] = dequant_rows(qw, start, stop).to(dtype)
    return out


def scale_to_float32(scale: torch.Tensor) -> torch.Tensor:
    """Checkpoint scales (float32, bf16, or ``float8_e8m0fnu`` for ``scale_fmt: ue8m0``) as float32."""
    return scale.to(torch.float32)


def fp4_data_to_uint8(data: torch.Tensor) -> torch.Tensor:
    """Packed FP4 as stored (``float4_e2m1fn_x2``, ``uint8`` or ``int8``; ``[out, in/2]``) -> ``uint8``."""
    if data.dtype == torch.uint8:
        return data
    if data.element_size() != 1:
        raise ValueError(f"packed fp4 data must be one byte per two values, got dtype {data.dtype}")
    return data.view(torch.uint8)
