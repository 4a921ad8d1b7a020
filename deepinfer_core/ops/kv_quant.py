"""DeepSeek-V4.1's activation quantisers, bit for bit: FP8 e4m3 and FP4 e2m1 codes with one scale per block.

V4.1 stores its KV this way and round-trips its index queries through FP4 (``docs/v41_reference.md``, 3.8):

- **FP8, ue8m0 scale per 32** (window KV): ``amax = max|x|`` over the block, clamped to ``>= 1e-4``;
  ``s = 2**ceil(log2(amax * fp32(1/448)))``, read from the float32 product's bits (its exponent, plus one
  when its mantissa is not zero); codes ``e4m3(clamp(x / s, +-448))``, rounded to nearest even.
- **FP4, ue8m0 scale per 32** (index keys and queries): ``amax`` clamped to ``>= 6 * 2**-126``,
  ``s = 2**ceil(log2(amax * fp32(1/6)))`` as above; ``v = clamp(x / s, +-6)``.
- **FP4, e4m3 scale per 16** (compressed KV): ``amax`` clamped to ``>= 6 * 2**-9``, ``s = e4m3(amax *
  fp32(1/6))`` (nearest even, saturating at 448); ``v = x / s``, a true division.
- **e2m1 codes**: the magnitude code counts the grid midpoints (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) strictly
  below ``|v|``; a value exactly on a midpoint takes the even code. The sign bit is ``signbit(v)``, so
  ``-0.0`` and negatives that round to zero keep code 8. Two codes per byte, element ``2i`` in the low
  nibble.

A value is always ``code * scale`` in float32. Everything here is pure PyTorch and works on any device.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
Fp4Scale = Literal["ue8m0", "e4m3"]
_E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def pow2_ceil_bits(x: torch.Tensor) -> torch.Tensor:
    """``2**ceil(log2(x))`` for positive normal float32 ``x``, from its bits: exponent, plus one when the
    mantissa is not zero (exact, no ``log2``)."""
    bits = x.float().contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (e << 23).view(torch.float32)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of the scale block {block}")
    return x.float().unflatten(-1, (-1, block))


def quantize_fp8(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., n]`` -> ``(codes float8_e4m3fn [..., n], scales float8_e8m0fnu [..., n / block])``."""
    g = _blocks(x, block)
    amax = g.abs().amax(-1).clamp_min(1e-4)
    s = pow2_ceil_bits(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
    codes = (g / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes.flatten(-2), s.to(torch.float8_e8m0fnu)


def dequantize_fp8(codes: torch.Tensor, scales: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8`: ``codes * scale`` in float32."""
    return (_blocks(codes.float(), block) * scales.float().unsqueeze(-1)).flatten(-2)


@functools.cache
def _table(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """A constant float32 table on ``device``, made once: a CUDA graph capture cannot copy it from pageable
    host memory on every call (the first call, a warm-up, runs outside the capture)."""
    return torch.tensor(values, dtype=torch.float32, device=device)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """float32 ``v`` already in ``[-6, 6]`` -> 4-bit codes (uint8, ``sign << 3 | magnitude``)."""
    mids = _table(_E2M1_MIDS, v.device)
    mag = v.abs().unsqueeze(-1)
    code = (mag > mids).sum(-1)
    on_mid = (mag == mids).any(-1)
    code = torch.where(on_mid & (code % 2 == 1), code + 1, code)  # a tie between codes i, i+1 takes the even
    return (code | (torch.signbit(v).to(code.dtype) << 3)).to(torch.uint8)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes -> float32 values (codes 8-15 are the negatives, 8 is ``-0.0``)."""
    grid = _table(E2M1_GRID, codes.device)
    return torch.cat([grid, -grid])[codes.long()]


def fp4_scale(amax: torch.Tensor, scale: Fp4Scale) -> torch.Tensor:
    """The float32 scale of a block with largest magnitude ``amax`` (see the module docstring)."""
    sixth = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)
    if scale == "e4m3":
        # saturated at e4m3's largest value before the cast: torch's own cast of larger values is NaN in some
        # versions (2.11) and 448 in others (2.13)
        return (amax.clamp_min(FP4_MAX * 2.0**-9) * sixth).clamp_max(448.0).to(torch.float8_e4m3fn).float()
    if scale == "ue8m0":
        return pow2_ceil_bits(amax.clamp_min(FP4_MAX * 2.0**-126) * sixth)
    raise ValueError(f"unknown FP4 scale format {scale!r}; expected 'ue8m0' or 'e4m3'")


def quantize_fp4(x: torch.Tensor, block: int, scale: Fp4Scale) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., n]`` -> ``(packed uint8 [..., n / 2], scales [..., n / block])``, scales as
    ``float8_e8m0fnu`` (``"ue8m0"``) or ``float8_e4m3fn`` (``"e4m3"``)."""
    g = _blocks(x, block)
    s = fp4_scale(g.abs().amax(-1), scale)
    codes = e2m1_codes((g / s.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX)).flatten(-2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, s.to(torch.float8_e8m0fnu if scale == "ue8m0" else torch.float8_e4m3fn)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """``[..., n / 2]`` bytes -> ``[..., n]`` float32 values (element ``2i`` from the low nibble)."""
    b = packed.view(torch.uint8)
    return torch.stack([e2m1_values(b & 0x0F), e2m1_values(b >> 4)], dim=-1).flatten(-2)


def dequantize_fp4(packed: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """Inverse of :func:`quantize_fp4`: ``code * scale`` in float32."""
    return (_blocks(unpack_e2m1(packed), block) * scales.float().unsqueeze(-1)).flatten(-2)


def fp4_roundtrip(x: torch.Tensor, block: int = 32, scale: Fp4Scale = "ue8m0") -> torch.Tensor:
    """``x`` quantised to FP4 and back, in ``x.dtype`` (V4.1's index queries)."""
    return dequantize_fp4(*quantize_fp4(x, block, scale), block).to(x.dtype)
