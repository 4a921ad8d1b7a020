"""Communication ops over ``torch.distributed`` with the HCCL backend (torch_npu registers ``"hccl"``).

The collectives are the core's :class:`TorchDistributedCommOps`, the ones torch.distributed offers for
every backend; uneven all-to-all goes through ``all_to_all_single`` with split sizes, which
ProcessGroupHCCL implements."""

from __future__ import annotations

from deepinfer_core.plugin_api import TorchDistributedCommOps


class AscendCommOps(TorchDistributedCommOps):
    dist_backend = "hccl"
