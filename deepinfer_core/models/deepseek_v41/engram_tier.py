"""Engram tables as a host memory tier: memory-mapped from the checkpoint, read by row.

V4.1-Flash's two tables are 768M rows x (256 B of FP8 codes + 8 B of ue8m0 scales), ~203 GB: they never
enter device memory and are never read whole. :func:`map_table` maps the shard file (``MAP_PRIVATE``: pages
are read on first touch and never written back) and views the stored bytes in place, so a table costs
address space, not RSS. :meth:`EngramTable.rows` gathers one step's rows on the host and dequantises them on
the device; on a GPU the gathered rows go through a pinned staging buffer (a copy the size of the step's
rows). Table bytes are reported apart from the weights and the KV budget (``host_tier_bytes``).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointError, CheckpointReader
from deepinfer_core.ops.quant_formats import scale_to_float32

#: safetensors dtype -> torch dtype for what an Engram table may hold
STORED = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
}
BLOCK = 32  # one scale per 32 values of a row


def map_tensor(file: Path, key: str) -> torch.Tensor:
    """Tensor ``key`` of safetensors ``file`` as a view of the file's memory map (no data is read)."""
    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(n))[key]
    start, end = entry["data_offsets"]
    size = os.path.getsize(file)
    if 8 + n + end > size:
        raise CheckpointError(f"truncated: {key} ({file.name})")
    whole = torch.from_file(str(file), shared=False, size=size, dtype=torch.uint8)
    return whole[8 + n + start : 8 + n + end].view(STORED[entry["dtype"]]).view(entry["shape"])


@dataclass
class EngramTable:
    """One Engram layer's table: ``codes [rows, dim]`` FP8 e4m3 and ``scales [rows, dim / 32]`` as stored,
    both views of the checkpoint's memory map; rows are dequantised on ``device``."""

    codes: torch.Tensor
    scales: torch.Tensor
    device: torch.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales))

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids [...]`` dequantised (code times the scale of its 32) -> ``[..., dim]`` in ``dtype``."""
        flat = ids.reshape(-1).cpu()
        codes, scales = _gather(self.codes, flat), _gather(self.scales, flat)
        if self.device.type == "cuda":
            codes = _staged(codes).to(self.device, non_blocking=True)
            scales = _staged(scales).to(self.device, non_blocking=True)
        v = codes.float().unflatten(-1, (-1, BLOCK)) * scale_to_float32(scales).unsqueeze(-1)
        return v.flatten(-2).reshape(*ids.shape, -1).to(dtype)


def _gather(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``table[ids]`` through a byte view (indexing float8 tensors is not supported everywhere)."""
    if table.element_size() != 1:
        return table[ids]
    return table.view(torch.uint8)[ids].view(table.dtype)


def _staged(t: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of ``t`` (one step's rows), so the copy to the GPU can run asynchronously."""
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    if t.element_size() == 1:
        buf.view(torch.uint8).copy_(t.view(torch.uint8))
    else:
        buf.copy_(t)
    return buf


def map_table(reader: CheckpointReader, key: str, scale_key: str, device: torch.device) -> EngramTable:
    """The Engram table ``key`` (and its ``scale_key``) of ``reader``'s checkpoint, memory-mapped."""
    codes = map_tensor(reader.path / reader.file_of(key), key)
    scales = map_tensor(reader.path / reader.file_of(scale_key), scale_key)
    return EngramTable(codes, scales, device)
