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


@triton.jit
def _host_rows_dequant_kernel(codes_ptr, scales_ptr, ids_ptr, out_ptr, W, NS, BLOCK: tl.constexpr, SB: tl.constexpr,
                              PDL: tl.constexpr = False):  # fmt: skip
    """Program ``i``: row ``ids[i]`` of a table of e4m3 codes ``[rows, W]`` with a ue8m0 scale byte per ``SB``
    ``[rows, NS]``, dequantised (``code * scale`` in float32, as torch converts both) into ``out[i]``."""
    pdl_enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(ids_ptr + i).to(tl.int64)
    c = tl.arange(0, BLOCK)
    for c0 in range(0, W, BLOCK):
        m = c0 + c < W
        code = tl.load(codes_ptr + row * W + c0 + c, mask=m, other=0.0).to(tl.float32)
        b = tl.load(scales_ptr + row * NS + (c0 + c) // SB, mask=m, other=127).to(tl.int32)
        # ue8m0 as torch reads it: 2**(b - 127); byte 0 is 2**-127 (a float32 subnormal), 255 is NaN
        bits = tl.where(b == 0, 0x00400000, tl.where(b == 255, 0x7FC00000, b << 23))
        y = code * bits.to(tl.float32, bitcast=True)
        tl.store(out_ptr + i * W + c0 + c, y.to(out_ptr.dtype.element_ty), mask=m)


def host_rows_dequant(codes: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, block: int, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:  # fmt: skip
    """Rows ``ids`` of a table of e4m3 codes ``codes [rows, W]`` (bytes) with ue8m0 scale bytes ``scales [rows, W /
    block]``, both page-locked host memory read in place, dequantised -> ``[len(ids), W]`` in ``dtype`` on
    ``device``, one launch (``MemoryOps.host_rows_dequant``)."""
    ids = ids.reshape(-1)
    n, w = ids.numel(), codes.shape[1]
    out = torch.empty((n, w), dtype=dtype, device=device)
    if n == 0:
        return out
    bl = min(1024, triton.next_power_of_2(w))
    _host_rows_dequant_kernel[(n,)](
        codes.view(torch.float8_e4m3fn), scales.view(torch.uint8), ids, out, w, scales.shape[1], BLOCK=bl, SB=block,
        num_warps=1 if bl <= 256 else 4, **dispatch.pdl_args(n),
    )  # fmt: skip
    return out
