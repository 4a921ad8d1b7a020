"""NCCL collectives through ``torch.distributed`` (identity in a single process)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from deepinfer_core.plugin_api import CommOps


def _world(group: object | None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class NcclCommOps(CommOps):
    dist_backend = "nccl"

    def all_gather(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        n = _world(group)
        if n == 1:
            return x
        x = x.contiguous()
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x, group=group)
        return out

    def all_reduce(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        if _world(group) > 1:
            dist.all_reduce(x, group=group)
        return x

    def all_to_all(
        self, x, send_counts: list[int], recv_counts: list[int], group: object | None = None
    ) -> torch.Tensor:
        if _world(group) == 1:
            return x
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts, group=group)
        return out
