"""Communication ops: collectives over ``torch.distributed`` for DP attention and EP MoE."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


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
