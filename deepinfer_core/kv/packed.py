"""Packed quantized cache entries: what one entry of a byte pool holds, and its exact size.

A :class:`PackedFormat` describes an entry of logical ``shape`` stored as low-precision codes with one
scale per ``block`` consecutive values of the last dimension. A cache spec that uses one stores each entry
as ``entry_bytes`` raw bytes (a ``uint8`` pool), so the KV budget counts exactly what is stored.

Byte layout of one entry (``lead = shape[:-1]``, ``n = shape[-1]``)::

    [ codes: prod(lead) x (n * bits / 8) | scales: prod(lead) x (n / block) ]

both row-major over ``lead``. ``e2m1`` codes are 4 bits, two per byte, value ``2i`` in the low nibble
(bit 3 of a nibble is the sign); ``e4m3`` codes are one byte each. A scale is one byte, ``e4m3`` or
``ue8m0`` (a power of two), and a value is ``code * scale``. How the codes are rounded is the model's
business (its quantiser); this module only fixes the layout and the size.

DeepSeek-V4.1's formats: compressed KV, 512 x e2m1 with an e4m3 scale per 16 (256 + 32 = 288 B); index
keys, 128 x e2m1 with a ue8m0 scale per 32 (64 + 4 = 68 B); window KV, 512 x e4m3 with a ue8m0 scale per
32 (512 + 16 = 528 B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: bits per code of each value format
VALUE_BITS = {"e2m1": 4, "e4m3": 8}
#: the dtype a scale byte is read as
SCALE_DTYPES = {"e4m3": torch.float8_e4m3fn, "ue8m0": torch.float8_e8m0fnu}


@dataclass(frozen=True)
class PackedFormat:
    values: str  # "e2m1" | "e4m3"
    scales: str  # "e4m3" | "ue8m0"
    block: int  # values per scale, along the last dimension
    shape: tuple[int, ...]  # logical shape of one entry

    def __post_init__(self) -> None:
        if self.values not in VALUE_BITS or self.scales not in SCALE_DTYPES:
            raise ValueError(
                f"packed format {self.values}/{self.scales} is invalid: values must be one of "
                f"{sorted(VALUE_BITS)}, scales one of {sorted(SCALE_DTYPES)}"
            )
        n = self.shape[-1] if self.shape else 0
        if not self.shape or min(self.shape) < 1 or self.block < 1 or n % self.block:
            raise ValueError(
                f"packed format {self.name} with shape {self.shape} is invalid: the last dimension must be a "
                f"positive multiple of the scale block {self.block}"
            )
        if n * VALUE_BITS[self.values] % 8:
            raise ValueError(f"packed format {self.name}: {n} codes do not fill whole bytes")

    @property
    def name(self) -> str:
        """For example ``"e2m1+e4m3/16"``: codes, scale format and values per scale."""
        return f"{self.values}+{self.scales}/{self.block}"

    @property
    def rows(self) -> int:
        """Scaled rows of one entry (``prod(shape[:-1])``)."""
        return math.prod(self.shape[:-1])

    @property
    def code_bytes(self) -> int:
        return self.rows * self.shape[-1] * VALUE_BITS[self.values] // 8

    @property
    def scale_bytes(self) -> int:
        return self.rows * (self.shape[-1] // self.block)

    @property
    def entry_bytes(self) -> int:
        """Exact bytes of one entry: codes plus scales, no padding."""
        return self.code_bytes + self.scale_bytes

    def split(self, entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[..., entry_bytes]`` uint8 -> views ``(codes [..., *lead, n * bits / 8] uint8,
        scales [..., *lead, n / block]`` in the scale's dtype), ``lead = shape[:-1]``."""
        if entries.dtype != torch.uint8 or entries.shape[-1] != self.entry_bytes:
            raise ValueError(
                f"{self.name} entries must be uint8 [..., {self.entry_bytes}], got "
                f"{entries.dtype} {list(entries.shape)}"
            )
        lead = self.shape[:-1]
        codes = entries[..., : self.code_bytes].unflatten(-1, (*lead, self.code_bytes // self.rows))
        scales = entries[..., self.code_bytes :].view(SCALE_DTYPES[self.scales])
        return codes, scales.unflatten(-1, (*lead, self.shape[-1] // self.block))
