"""V4.1's quantized cache entries: each a :class:`~deepinfer_core.kv.packed.PackedFormat` (layout and exact size)
bound to the reference's quantiser (:mod:`deepinfer_core.ops.kv_quant`, bit for bit), as the KV codec the
attention ops read and write (``pack`` / ``unpack``, see :mod:`deepinfer_core.ops.attention`).

| state | format | bytes per entry (published sizes) |
|---|---|---|
| window KV (every layer) | ``head_dim`` x e4m3, a ue8m0 scale per 32 | 512 + 16 = 528 |
| compressed KV (Full layers) | ``head_dim`` x e2m1, an e4m3 scale per 16 | 256 + 32 = 288 |
| index keys (Full layers) | ``index_head_dim`` x e2m1, a ue8m0 scale per 32 | 64 + 4 = 68 |

``kv_cache_dtype="auto"`` stores these (the model was trained with them); ``"unquantized"`` stores plain rows in
the model dtype and skips every KV / index round trip (the exactness setting).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_core.kv.packed import PackedFormat
from deepinfer_core.ops.kv_quant import dequantize_fp4, dequantize_fp8, quantize_fp4, quantize_fp8


@dataclass(frozen=True)
class PackedKV:
    """A KV codec: ``pack(values [N, n]) -> [N, entry_bytes] uint8`` and ``unpack`` back to ``dtype``."""

    fmt: PackedFormat
    dtype: torch.dtype  # what unpack returns (the model dtype; every value is exact in it)

    @property
    def row_bytes(self) -> int:
        return self.fmt.entry_bytes

    def pack(self, values: torch.Tensor) -> torch.Tensor:
        f = self.fmt
        if f.values == "e4m3":
            codes, scales = quantize_fp8(values, f.block)
            codes = codes.view(torch.uint8)
        else:
            codes, scales = quantize_fp4(values, f.block, f.scales)
        out = torch.empty(values.shape[0], f.entry_bytes, dtype=torch.uint8, device=values.device)
        code_view, scale_view = f.split(out)
        code_view.copy_(codes)
        scale_view.copy_(scales)
        return out

    def unpack(self, rows: torch.Tensor) -> torch.Tensor:
        f = self.fmt
        codes, scales = f.split(rows)
        if f.values == "e4m3":
            values = dequantize_fp8(codes.view(torch.float8_e4m3fn), scales, f.block)
        else:
            values = dequantize_fp4(codes, scales, f.block)
        return values.to(self.dtype)

    def roundtrip(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` as the pool returns them after a store (what the reference computes in place)."""
        return self.unpack(self.pack(values)).to(values.dtype)


def window_kv(head_dim: int, dtype: torch.dtype) -> PackedKV:
    return PackedKV(PackedFormat("e4m3", "ue8m0", 32, (head_dim,)), dtype)


def compressed_kv(head_dim: int, dtype: torch.dtype) -> PackedKV:
    return PackedKV(PackedFormat("e2m1", "e4m3", 16, (head_dim,)), dtype)


def index_keys(index_head_dim: int, dtype: torch.dtype) -> PackedKV:
    return PackedKV(PackedFormat("e2m1", "ue8m0", 32, (index_head_dim,)), dtype)


@dataclass(frozen=True)
class KVFormats:
    """The codecs of one model, ``None`` each under ``kv_cache_dtype="unquantized"``."""

    window: PackedKV | None = None
    compressed: PackedKV | None = None
    keys: PackedKV | None = None

    @property
    def quantized(self) -> bool:
        return self.window is not None


#: the values of ``kv_cache_dtype`` V4.1 takes: its trained formats, or plain rows in the model dtype
V41_KV_CACHE_DTYPES = ("auto", "unquantized")


def kv_formats(kv_cache_dtype: str, head_dim: int, index_head_dim: int, dtype: torch.dtype) -> KVFormats:
    if kv_cache_dtype not in V41_KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype={kv_cache_dtype!r}: DeepSeek-V4.1 takes 'auto' (its trained FP8 / FP4 cache) or "
            "'unquantized' (plain rows in the model dtype)"
        )
    if kv_cache_dtype == "unquantized":
        return KVFormats()
    return KVFormats(
        window_kv(head_dim, dtype), compressed_kv(head_dim, dtype), index_keys(index_head_dim, dtype)
    )
