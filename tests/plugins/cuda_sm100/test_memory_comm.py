"""CudaMemoryOps' KV budget (with torch.cuda mocked) and NcclCommOps in a single process."""

from __future__ import annotations

import pytest
import torch

from deepinfer_cuda_sm100.ops.comm import NcclCommOps
from deepinfer_cuda_sm100.ops.memory import CudaMemoryOps, kv_budget

GiB = 1 << 30


def test_kv_budget_counts_what_is_in_use():
    # 140 GiB card, 0.9 allowed = 126; 40 GiB in use (weights loaded) -> 86 GiB for KV
    assert kv_budget(100 * GiB, 140 * GiB, 0.9, 30 * GiB) == 86 * GiB


def test_kv_budget_reserves_weights_not_loaded_yet():
    # nearly empty card, weights (60 GiB) still to load -> 126 - 60
    assert kv_budget(139 * GiB, 140 * GiB, 0.9, 60 * GiB) == 66 * GiB


def test_kv_budget_never_negative():
    assert kv_budget(5 * GiB, 140 * GiB, 0.5, 0) == 0


def test_available_kv_bytes_reads_mem_get_info(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (80 * GiB, 100 * GiB))
    ops = CudaMemoryOps(device="cuda:0")
    assert ops.device == torch.device("cuda:0")
    assert ops.available_kv_bytes(0.8, 10 * GiB) == 60 * GiB
    assert calls == ["sync"]


def test_comm_is_identity_in_one_process():
    ops = NcclCommOps()
    x = torch.arange(6.0).view(3, 2)
    assert ops.dist_backend == "nccl"
    assert ops.all_gather(x) is x and ops.all_reduce(x) is x and ops.all_to_all(x, [3], [3]) is x


@pytest.mark.parametrize("width", [256, 8, 6])
def test_host_rows_reads_a_host_table_s_rows_in_place(gen, width):
    """``MemoryOps.host_rows`` on this plugin (V4.1's Engram rows read inside the step): one launch reading
    rows of a table in page-locked host memory (on a GPU; the interpreter reads the CPU table) at ids on the
    device, repeats and the last row included; 4-byte words where the width allows, bytes otherwise."""
    from deepinfer_cuda_sm100.kernels import host_rows

    from .cuda_sm100_helpers import DEVICE

    table = torch.randint(0, 256, (50, width), generator=gen, dtype=torch.uint8)
    ids = torch.tensor([3, 49, 0, 3, 17, 48])
    if DEVICE.type == "cuda":
        readable = CudaMemoryOps().readable_host_copy(table)
        assert readable.is_pinned() and readable.device.type == "cpu" and torch.equal(readable, table)
    else:
        readable = table
    got = host_rows.host_rows(readable, ids.to(DEVICE), DEVICE)
    assert got.device.type == DEVICE.type and torch.equal(got.cpu(), table[ids])
    assert host_rows.host_rows(readable, ids[:0].to(DEVICE), DEVICE).shape == (0, width)
