"""Random weights of a tiny V4.1 checkpoint, turned into the tensors the published layout stores.

Each tensor draws from its own generator, seeded by ``seed`` and the CRC-32 of its name, so adding a tensor
never changes another's values. FP8 and FP4 use the project's own quantisers
(:mod:`deepinfer_core.ops.quant_formats`) with 32-wide blocks and power-of-two (ue8m0) scales; the Engram tables'
row-wise scales are computed here. Any correctly formatted values serve: the reference consumes them as stored.
"""

from __future__ import annotations

import zlib

import torch

from deepinfer_core.ops.quant_formats import FP8_MAX, pow2_ceil, quantize_fp4_e2m1, quantize_fp8_block

from .layout import TensorSpec

BLOCK = 32


def draw(t: TensorSpec, seed: int) -> torch.Tensor:
    """float32 values of ``t``: normal with ``t.std`` around ``t.mean``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(t.name.encode()))
    return torch.randn(t.shape, generator=g, dtype=torch.float32) * t.std + t.mean


def fp8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, d]`` -> F8_E4M3 data and one ue8m0 scale per row and 32 channels ``[rows, d/32]``."""
    g = w.float().unflatten(-1, (-1, BLOCK))
    scale = pow2_ceil((g.abs().amax(-1) / FP8_MAX).clamp(min=2.0**-126))
    data = (g / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).flatten(-2).to(torch.float8_e4m3fn)
    return data, scale.to(torch.float8_e8m0fnu)


def store(t: TensorSpec, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """The stored tensor(s) for ``t`` holding ``w``: the data, and ``<module>.scale`` where quantised."""
    base = t.name[: -len(".weight")] if t.name.endswith(".weight") else t.name
    if t.fmt == "fp8":
        q = quantize_fp8_block(w, "ue8m0", block=BLOCK)
        return {t.name: q.data, f"{base}.scale": q.scale.to(torch.float8_e8m0fnu)}
    if t.fmt == "fp4":
        q = quantize_fp4_e2m1(w, block=BLOCK)
        return {t.name: q.data.view(torch.int8), f"{base}.scale": q.scale.to(torch.float8_e8m0fnu)}
    if t.fmt == "fp8_rows":
        data, scale = fp8_rows(w)
        return {t.name: data, f"{base}.scale": scale}
    if t.fmt == "bf16":
        return {t.name: w.to(torch.bfloat16)}
    if t.fmt == "f32":
        return {t.name: w}
    raise ValueError(f"{t.name}: unknown format {t.fmt!r}")


def state(tensors: list[TensorSpec], seed: int) -> dict[str, torch.Tensor]:
    """Every stored tensor of the checkpoint, in the published layout."""
    out: dict[str, torch.Tensor] = {}
    for t in tensors:
        out.update(store(t, draw(t, seed)))
    return out
