"""Memory ops on the NPU: KV pools in device memory sized from ``torch.npu.mem_get_info``, pinned host
buffers, and step capture as ACL graphs (``torch.npu.NPUGraph`` + ``torch.npu.graph``, as in the
torch_npu NPUGraph pages)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer_ascend950._npu import device, torch_npu
from deepinfer_core.plugin_api import MemoryOps


class AscendMemoryOps(MemoryOps):
    def __init__(self, graphs: bool):
        torch_npu()  # registers torch.npu
        self.device = device()
        self.graphs = graphs

    def available_kv_bytes(self, gpu_memory_utilization: float, model_bytes: int) -> int:
        """``total * utilization - (total - free)``: the model and everything else already on the device
        count against the utilization budget (``model_bytes`` is already inside ``total - free``)."""
        free, total = torch.npu.mem_get_info(self.device)
        return max(0, int(total * gpu_memory_utilization) - (total - free))

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def pinned_host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=self.device.type != "cpu")

    def synchronize(self) -> None:
        torch.npu.synchronize()

    def capture_graph(self, fn: Callable[[], object]) -> Callable[[], object] | None:
        """Warm ``fn`` up once on a side stream, capture it into a ``torch.npu.NPUGraph`` and return the
        graph's ``replay``; ``None`` when graphs are off (``enforce_eager``, or the setting ``ascend950.graphs`` off)."""
        if not self.graphs:
            return None
        npu = torch.npu
        side = npu.Stream()
        side.wait_stream(npu.current_stream())
        with npu.stream(side):
            fn()
        npu.current_stream().wait_stream(side)
        graph = npu.NPUGraph()
        with npu.graph(graph):
            fn()
        return graph.replay
