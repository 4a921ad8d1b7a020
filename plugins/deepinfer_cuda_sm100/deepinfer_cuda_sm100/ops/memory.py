"""CUDA memory ops: KV budget from the device's free memory, device pools, pinned buffers, CUDA graphs."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from deepinfer_core.plugin_api import MemoryOps
from deepinfer_cuda_sm100.kernels import side_branch
from deepinfer_cuda_sm100.kernels.host_rows import host_rows, host_rows_dequant


def kv_budget(free: int, total: int, gpu_memory_utilization: float, model_bytes: int) -> int:
    """Bytes left for KV pools if the engine may use ``gpu_memory_utilization`` of the whole device.

    In use now is ``total - free`` (other processes, the CUDA context, and the weights if they are
    loaded already); if the weights are not loaded yet, ``model_bytes`` of them are still to come.
    """
    in_use = max(total - free, model_bytes)
    return max(0, int(total * gpu_memory_utilization) - in_use)


class CudaMemoryOps(MemoryOps):
    supports_graphs = True
    overlaps_host = True  # kernels run on a stream: the engine overlaps scheduling by default
    reads_host_memory = True  # page-locked host memory is mapped for the device (unified addressing)

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
        self._graphs = GraphPool(self.device)

    def available_kv_bytes(self, gpu_memory_utilization: float, model_bytes: int) -> int:
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return kv_budget(free, total, gpu_memory_utilization, model_bytes)

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def pinned_host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def readable_host_copy(self, t: torch.Tensor) -> torch.Tensor:
        """A page-locked copy of host tensor ``t``, which the device reads in place (:meth:`host_rows`)."""
        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t)
        return buf

    def host_rows(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return host_rows(table, ids, self.device)

    def host_rows_dequant(self, codes, scales, ids, formats, dtype) -> torch.Tensor:
        """One launch for V4.1's Engram format (e4m3 codes, ue8m0 bytes per power-of-two block): the codes and
        scales read in place and dequantised (the default: two reads and four torch launches)."""
        code_dtype, scale_dtype, block = formats
        if (
            code_dtype == torch.float8_e4m3fn
            and scale_dtype == torch.float8_e8m0fnu
            and codes.shape[1] % block == 0
        ):
            return host_rows_dequant(codes, scales, ids, block, dtype, self.device)
        return super().host_rows_dequant(codes, scales, ids, formats, dtype)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def capture_graph(self, fn: Callable[[], object]) -> Callable[[], object] | None:
        return self._graphs.capture(fn)


class GraphPool:
    """CUDA graphs captured on ``device`` into one memory pool while any of them is alive (they never run
    concurrently). Once they are all gone (an engine shut down), the next capture takes a fresh pool: PyTorch's
    allocator refuses a capture into a pool whose graphs are gone while a tensor it made is still held
    (``use_count > 0``; H200, 2026-12-05)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pool = None
        self._graphs: weakref.WeakSet = weakref.WeakSet()

    def capture(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Warm ``fn`` up on a side stream (so lazy inits and Triton compiles stay out of the graph),
        capture it once, and return ``graph.replay`` (a capture records: the caller replays to run it)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
                side_branch.join(self.device)  # a side branch left open would not be joined into the capture
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None or not self._graphs:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            fn()
            side_branch.join(self.device)
        self._graphs.add(graph)
        return graph.replay
