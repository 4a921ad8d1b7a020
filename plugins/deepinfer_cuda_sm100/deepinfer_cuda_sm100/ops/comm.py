"""NCCL collectives: the core's ``torch.distributed`` implementation on the NCCL backend (identity in a
single process)."""

from __future__ import annotations

from deepinfer_core.plugin_api import TorchDistributedCommOps


class NcclCommOps(TorchDistributedCommOps):
    dist_backend = "nccl"
