"""Rows of a page-locked host table read by the GPU in place: ``out[i] = table[ids[i]]`` with ``ids`` on the
device, in one launch the host never waits for and a CUDA graph can hold (V4.1's Engram tables,
``MemoryOps.host_rows``).

Memory from ``torch.empty(..., pin_memory=True)`` is mapped into the device's address space (CUDA's unified
addressing: the same pointer on both sides), so the kernel loads it over the host link like device memory.
A step reads a few KB of rows: one program a row, 4-byte words where the row width allows."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter


@triton.jit
def _host_rows_kernel(table_ptr, ids_ptr, out_ptr, W, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``i``: ``out[i, :W] = table[ids[i], :W]``."""
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(ids_ptr + i).to(tl.int64)
    c = tl.arange(0, BLOCK)
    for c0 in range(0, W, BLOCK):
        m = c0 + c < W
        tl.store(out_ptr + i * W + c0 + c, tl.load(table_ptr + row * W + c0 + c, mask=m), mask=m)


def host_rows(table: torch.Tensor, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``table[ids]`` -> ``[len(ids), width]`` on ``device``: ``table [rows, width]`` (contiguous; on a GPU
    page-locked host memory, read in place), ``ids [n]`` integer row numbers on ``device``."""
    ids = ids.reshape(-1)
    n, w = ids.numel(), table.shape[1]
    out = torch.empty((n, w), dtype=table.dtype, device=device)
    if n == 0:
        return out
    words = table.view(torch.int32) if table.element_size() == 1 and w % 4 == 0 else table
    ow = out.view(words.dtype)
    ww = words.shape[1]
    block = min(256, triton.next_power_of_2(ww))
    _host_rows_kernel[(n,)](words, ids, ow, ww, BLOCK=block, num_warps=1 if block <= 64 else 2,
                            **dispatch.pdl_args(n))  # fmt: skip
    return out
