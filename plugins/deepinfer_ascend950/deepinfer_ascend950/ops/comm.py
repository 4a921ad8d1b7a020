"""Communication ops over ``torch.distributed`` with the HCCL backend (torch_npu registers ``"hccl"``).

The collectives are the ones torch.distributed offers for every backend; uneven all-to-all goes through
``all_to_all_single`` with split sizes, which ProcessGroupHCCL implements."""

from __future__ import annotations

import torch
import torch.distributed as dist

from deepinfer_core.plugin_api import CommOps


def _world(group: object | None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class AscendCommOps(CommOps):
    dist_backend = "hccl"

    def all_gather(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        n = _world(group)
        if n == 1:
            return x
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    def all_reduce(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        if _world(group) > 1:
            dist.all_reduce(x, group=group)
        return x

    def all_to_all(
        self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: object | None = None
    ) -> torch.Tensor:
        if _world(group) == 1:
            return x
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        dist.all_to_all_single(
            out, x.contiguous(), output_split_sizes=recv_counts, input_split_sizes=send_counts, group=group
        )
        return out
