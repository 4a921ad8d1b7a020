"""Engram tables as a host memory tier: memory-mapped from the checkpoint, read by row.

V4.1-Flash's two tables are 768M rows x (256 B of FP8 codes + 8 B of ue8m0 scales), ~203 GB: they never
enter device memory and are never read whole. :func:`map_table` maps the shard file (``MAP_PRIVATE``: pages
are read on first touch and never written back) and views the stored bytes in place, so a table costs
address space, not RSS. Table bytes are reported apart from the weights and the KV budget (``host_tier_bytes``).

**Prefetch.** :meth:`EngramTable.fetch` starts reading a step's rows and returns at once; the model calls it
for every Engram layer as soon as the step's hash ids exist (before its first block), and each Engram layer
waits (:meth:`PendingRows.wait`) only when it needs its rows, so the reads overlap the layers before it (in
V4.1-Flash: layer 14's rows load during layers 0-13). The reads run on one background thread
(``engram-fetch``), in the order they were started. On a GPU the step's ids are copied to pinned host memory
without blocking; the thread waits for that copy (an event), gathers the rows from the memory map into a
pinned staging buffer and copies them to the device on a side stream, and the layer's stream waits for that
copy (an event), so neither the host loop nor the GPU's compute stream waits for the host tier unless the
rows are late. The rows of a step cannot be read before its hash ids exist: a decode step's ids hash the
token the previous step samples, so there is nothing to fetch a whole step ahead. A static step (one a
platform may replay as a graph) reads its rows before it starts instead (``prepare_static``): a graph cannot
wait for the host mid-step.

**In step.** Where the device reads page-locked host memory in place (``MemoryOps.reads_host_memory``, CUDA)
and the tables fit (``engram_in_step``), :meth:`EngramTable.in_step` copies them there once, and a step reads
its rows on the device itself (``MemoryOps.host_rows``), right after hashing the ids it just wrote: no thread,
no host wait, and a graph holds the read, so overlap scheduling keeps preparing the next step while the
device runs this one.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
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
    #: (memory ops, codes bytes, scales bytes) the device reads in place (:meth:`in_step`), or None
    readable: tuple | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales))

    def in_step(self, memory) -> None:
        """Copy the table where ``memory``'s device reads it in place (``MemoryOps.readable_host_copy``): from
        now on a fetch is a device read inside the step."""
        codes, scales = (memory.readable_host_copy(t.view(torch.uint8)) for t in (self.codes, self.scales))
        self.readable = (memory, codes, scales)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids [...]`` dequantised (code times the scale of its 32) -> ``[..., dim]`` in ``dtype``."""
        return self.fetch(ids).wait(dtype)

    def fetch(self, ids: torch.Tensor) -> PendingRows:
        """Start reading rows ``ids [...]`` (on the table's device) in the background; returns at once. A table
        :meth:`in_step` is read by the device now (queued on its stream)."""
        flat = ids.reshape(-1)
        if self.readable is not None:  # read and dequantised by the device, in the step, when waited for
            memory, codes, scales = self.readable
            formats = (self.codes.dtype, self.scales.dtype, BLOCK)
            return PendingRows(
                None,
                tuple(ids.shape),
                lambda dtype: memory.host_rows_dequant(codes, scales, flat, formats, dtype),
            )
        ready = None
        if self.device.type == "cuda":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            flat = host
        else:
            flat = flat.cpu()
        return PendingRows(_fetcher().submit(self._read, flat, ready), tuple(ids.shape))

    def _read(self, ids: torch.Tensor, ready) -> tuple[torch.Tensor, torch.Tensor, object]:
        """(On the fetch thread.) The rows' codes and scales, on the device; with the copy's event on a GPU."""
        if ready is not None:
            ready.synchronize()  # the step's ids have reached the pinned buffer
        codes, scales = _gather(self.codes, ids), _gather(self.scales, ids)
        if self.device.type != "cuda":
            return codes, scales, None
        codes, scales = _staged(codes), _staged(scales)
        stream = _copy_stream(self.device)
        with torch.cuda.stream(stream):
            codes = codes.to(self.device, non_blocking=True)
            scales = scales.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        return codes, scales, done


@dataclass
class PendingRows:
    """Rows an :meth:`EngramTable.fetch` is reading (``future``), or, read in the step, the device read that
    gives them (``read``: dtype -> rows)."""

    future: Future | None
    shape: tuple[int, ...]
    read: Callable[[torch.dtype], torch.Tensor] | None = None

    def wait(self, dtype: torch.dtype) -> torch.Tensor:
        """The rows dequantised -> ``[*shape, dim]`` in ``dtype``; on a GPU the current stream waits for their
        copy (the host does not). Errors of the read are raised here."""
        if self.read is not None:
            rows = self.read(dtype)
            return rows.reshape(*self.shape, -1)
        codes, scales, done = self.future.result()
        if done is not None:
            current = torch.cuda.current_stream(codes.device)
            current.wait_event(done)
            codes.record_stream(current)  # allocated on the copy stream, used on this one
            scales.record_stream(current)
        v = codes.float().unflatten(-1, (-1, BLOCK)) * scale_to_float32(scales).unsqueeze(-1)
        return v.flatten(-2).reshape(*self.shape, -1).to(dtype)


_FETCHER: ThreadPoolExecutor | None = None
_STREAMS: dict[torch.device, object] = {}
_LOCK = threading.Lock()


def _fetcher() -> ThreadPoolExecutor:
    """The one background thread that reads Engram rows (reads run in the order they are started)."""
    global _FETCHER
    with _LOCK:
        if _FETCHER is None:
            _FETCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-fetch")
        return _FETCHER


def _forget_fetcher() -> None:
    """In a forked child: the parent's fetch thread does not exist there."""
    global _FETCHER
    _FETCHER = None
    _STREAMS.clear()


os.register_at_fork(after_in_child=_forget_fetcher)


def _copy_stream(device: torch.device):
    """(On the fetch thread.) The side stream the rows are copied to ``device`` on."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


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
