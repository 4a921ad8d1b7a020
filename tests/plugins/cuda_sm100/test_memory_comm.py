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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_host_rows_dequant_reads_and_dequantises_in_one_launch(gen, dtype):
    """``MemoryOps.host_rows_dequant`` on this plugin (V4.1's Engram rows, e4m3 codes with a ue8m0 byte per 32):
    one launch reads a row's codes and scales in place and dequantises them, equal to the core's default (two
    reads, then ``code * scale`` in float32 and the cast), bit for bit, every finite code included, and in float32
    the scale byte 0 (``2**-127``)."""
    from deepinfer_core.ops.memory import MemoryOps
    from deepinfer_cuda_sm100.kernels import host_rows

    from .cuda_sm100_helpers import DEVICE, Counting

    codes = torch.arange(256, dtype=torch.uint8).repeat(1, 2).view(2, 256)  # every code, twice
    codes = torch.cat([codes, torch.randint(0, 256, (38, 256), generator=gen, dtype=torch.uint8)])
    codes[(codes & 0x7F) == 0x7F] = 0x38  # NaN codes left out (NaN != NaN)
    scales = torch.randint(100, 150, (40, 8), generator=gen, dtype=torch.uint8)
    if dtype == torch.float32:  # byte 0 is 2**-127: products are float32 subnormals, whose cast to bf16 the
        scales[0, :] = 0  # interpreter (numpy) rounds otherwise than torch; float32 holds them exactly
    ids = torch.tensor([0, 39, 1, 0, 17, 5])

    class Plain(MemoryOps):  # the core's default over the same reads
        device = DEVICE

        def host_rows(self, table, i):
            return host_rows.host_rows(table, i, DEVICE)

        available_kv_bytes = allocate = pinned_host_buffer = synchronize = None

    fmt = (torch.float8_e4m3fn, torch.float8_e8m0fnu, 32)
    want = Plain().host_rows_dequant(codes, scales, ids.to(DEVICE), fmt, dtype)
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            host_rows, "_host_rows_dequant_kernel", Counting(host_rows._host_rows_dequant_kernel, calls)
        )
        got = host_rows.host_rows_dequant(codes, scales, ids.to(DEVICE), 32, dtype, DEVICE)
    assert len(calls) == 1 and got.dtype == dtype and got.shape == (6, 256)
    assert torch.equal(got.cpu().view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.cpu().view(torch.int16 if dtype == torch.bfloat16 else torch.int32))  # fmt: skip
    assert torch.count_nonzero(got[0].float()) > 0 and got[1].abs().max() > 0
