"""Communication ops: collectives over ``torch.distributed`` for DP attention and EP MoE.

:class:`CommOps` is the contract. :class:`TorchDistributedCommOps` implements it once over
``torch.distributed`` for every platform: a platform names its process-group backend (``dist_backend``)
and, where its backend lacks a single-tensor collective, overrides the one primitive that uses it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.distributed as dist


class CommOps(ABC):
    #: torch.distributed backend name: "gloo", "nccl", "hccl", ...
    dist_backend: str

    @abstractmethod
    def all_gather(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        """Concatenate ``x`` from every rank along dim 0 (equal shapes). Single process: ``x``."""

    @abstractmethod
    def all_reduce(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        """Sum ``x`` over ranks (in place where possible) and return it. Single process: ``x``."""

    @abstractmethod
    def all_to_all(
        self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: object | None = None
    ) -> torch.Tensor:
        """Variable-size all-to-all along dim 0: rank ``r`` receives ``send_counts[r]`` rows from us.
        Single process: ``x``."""


def world_size(group: object | None = None) -> int:
    """Ranks in ``group`` (the default group for ``None``); 1 when torch.distributed is not initialised."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class TorchDistributedCommOps(CommOps):
    """The collectives through ``torch.distributed``, identities in a single process.

    Subclasses set :attr:`dist_backend`. The two primitives, :meth:`gather_into` and :meth:`exchange_into`,
    use torch's single-tensor collectives (``all_gather_into_tensor``, ``all_to_all_single`` with split
    sizes), which NCCL and HCCL implement; a backend without them overrides just those.
    """

    def all_gather(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        n = world_size(group)
        if n == 1:
            return x
        x = x.contiguous()
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))
        self.gather_into(out, x, group)
        return out

    def all_reduce(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        if world_size(group) > 1:
            dist.all_reduce(x, group=group)
        return x

    def all_to_all(
        self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: object | None = None
    ) -> torch.Tensor:
        if world_size(group) == 1:
            return x
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        self.exchange_into(out, x.contiguous(), send_counts, recv_counts, group)
        return out

    def gather_into(self, out: torch.Tensor, x: torch.Tensor, group: object | None) -> None:
        """``out [world * N, ...]`` = every rank's contiguous ``x [N, ...]``, in rank order."""
        dist.all_gather_into_tensor(out, x, group=group)

    def exchange_into(
        self,
        out: torch.Tensor,
        x: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        group: object | None,
    ) -> None:
        """``out [sum(recv_counts), ...]``: ``recv_counts[r]`` rows from each rank ``r``, in rank order, from
        our contiguous ``x`` split by ``send_counts``."""
        dist.all_to_all_single(
            out, x, output_split_sizes=recv_counts, input_split_sizes=send_counts, group=group
        )
