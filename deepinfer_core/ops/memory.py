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

    def capture_graph(self, fn: Callable[[], object]) -> Callable[[], object] | None:
        """Capture ``fn`` (which reads and writes only static buffers) as a replayable graph.
        Returns the replay callable, or ``None`` where the platform has no graphs (the default)."""
        return None
