"""The collectives live once, in the core: each platform's comm ops are ``TorchDistributedCommOps`` that
name their process-group backend, and the reference differs only in the gloo-portable primitives."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.comm import TorchDistributedCommOps
from deepinfer_core.ops.reference.comm import ReferenceCommOps


def _platform_comm_ops() -> list[tuple[type, str]]:
    cuda = pytest.importorskip("deepinfer_cuda_sm100.ops.comm")
    ascend = pytest.importorskip("deepinfer_ascend950.ops.comm")
    return [(cuda.NcclCommOps, "nccl"), (ascend.AscendCommOps, "hccl")]


def test_platforms_name_their_backend_and_copy_no_collective():
    for cls, backend in _platform_comm_ops():
        assert issubclass(cls, TorchDistributedCommOps) and cls.dist_backend == backend
        assert {k for k in vars(cls) if not k.startswith("_")} == {"dist_backend"}, cls.__name__


def test_the_reference_overrides_only_the_two_primitives():
    assert issubclass(ReferenceCommOps, TorchDistributedCommOps) and ReferenceCommOps.dist_backend == "gloo"
    own = {k for k in vars(ReferenceCommOps) if not k.startswith("_")}
    assert own == {"dist_backend", "gather_into", "exchange_into"}


def test_every_collective_is_the_identity_in_one_process():
    x = torch.randn(4, 3)
    for ops in (ReferenceCommOps(), *(cls() for cls, _ in _platform_comm_ops())):
        assert ops.all_gather(x) is x and ops.all_reduce(x) is x and ops.all_to_all(x, [4], [4]) is x
