"""Reference memory ops: host memory on the CPU, no streams, no graphs."""

from __future__ import annotations

import torch

from deepinfer_core.ops.memory import MemoryOps


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else a conservative 4 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


class ReferenceMemoryOps(MemoryOps):
    device = torch.device("cpu")
    #: host memory the KV budget leaves free (the reference platform's ``host_reserve_bytes`` setting)
    host_reserve_bytes: int = 0

    def available_kv_bytes(self, gpu_memory_utilization: float, model_bytes: int) -> int:
        """On the CPU the "device" is host memory: a fraction of what is free now (the model is loaded)."""
        return max(0, int(host_available_bytes() * gpu_memory_utilization) - self.host_reserve_bytes)

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def pinned_host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def synchronize(self) -> None:
        return None
