"""Memory ops: device, KV pool allocation, host buffers, streams and graph capture."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch


class MemoryOps(ABC):
    device: torch.device
    #: :meth:`capture_graph` captures (the engine then runs decode steps with static shapes and replays)
    supports_graphs: bool = False
    #: queued device work runs while the host goes on (a stream), so overlap scheduling pays: the engine's
    #: ``async_scheduling`` defaults to this
    overlaps_host: bool = False
    #: the device reads page-locked host memory in place (:meth:`host_rows`), inside a step and its graph:
    #: a host tier that fits in host memory (V4.1's Engram tables) is then read with no host wait
    reads_host_memory: bool = False

    @abstractmethod
    def available_kv_bytes(self, gpu_memory_utilization: float, model_bytes: int) -> int:
        """Bytes the KV pools may use when ``kv_cache_memory_bytes`` is not set."""

    @abstractmethod
    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zero-filled device tensor for a KV pool."""

    @abstractmethod
    def pinned_host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host tensor suitable for asynchronous copies to the device."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all queued device work."""

    def readable_host_copy(self, t: torch.Tensor) -> torch.Tensor:
        """Host tensor ``t`` where :meth:`host_rows` reads it in place (a page-locked copy on a GPU). The
        default: ``t`` itself (a CPU device reads host memory as it is)."""
        return t

    def host_rows(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``table[ids]`` on the device, for ``table [rows, width]`` from :meth:`readable_host_copy` and ``ids``
        on the device: read in place by the device, so the host never waits and a graph may hold the read.
        The default indexes on the host (correct anywhere, waits for ``ids``)."""
        return table[ids.to(table.device)].to(self.device)

    def host_rows_dequant(
        self, codes: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, formats: tuple, dtype: torch.dtype
    ) -> torch.Tensor:
        """Rows ``ids`` of a block-scaled table, dequantised on the device: ``codes [rows, dim]`` and ``scales
        [rows, dim / block]`` byte tables from :meth:`readable_host_copy` holding ``formats = (code dtype, scale
        dtype, block)`` (V4.1's Engram tables: e4m3 codes, a ue8m0 scale per 32) -> ``[len(ids), dim]`` in
        ``dtype``: ``code * scale`` in float32, then cast (plugin API 2.13). The default reads both with
        :meth:`host_rows` and dequantises in torch; a platform may do it all in one read."""
        code_dtype, scale_dtype, block = formats
        c = self.host_rows(codes, ids).view(code_dtype).float()
        s = self.host_rows(scales, ids).view(scale_dtype).float()
        return (c.unflatten(-1, (-1, block)) * s.unsqueeze(-1)).flatten(-2).to(dtype)

    def capture_graph(self, fn: Callable[[], object]) -> Callable[[], object] | None:
        """Capture ``fn`` (which reads and writes only static buffers) as a replayable graph.
        Returns the replay callable, or ``None`` where the platform has no graphs (the default)."""
        return None
