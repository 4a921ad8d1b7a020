"""A static step's slot plan in three launches (``compose_static_plan``: V4's and V4.1's ``device_plan``, built
inside the captured decode graph from the positions and the block tables). The core's composition is ~90 torch
operators, ~50 of them kernels a few microseconds each in the graph; here one launch writes the request index,
the token's and the window's slots, and one launch a compression kind its entry, source and candidate slots.

One program a row (and, for the candidates, a ``BLOCK_C`` chunk of columns); every slot is
:func:`deepinfer_core.ops.slot_tables.lookup_slots`'s: ``block * (block_size / tokens_per_entry) + entry %
(block_size / tokens_per_entry)``, ``-1`` for a negative position, a column past the table or an absent block
(``-1``); candidate columns past a row's visible entries are ``-1`` and those in an absent block negative."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pow2


@triton.jit
def _lookup(table_ptr, stride_t, ncols, req, p, block_size, tokens_per_entry):
    """Slot of the entry holding position ``p`` (int64, any shape) of request ``req`` in a block table."""
    valid = p >= 0
    q = tl.where(valid, p, 0)
    col = q // block_size
    block = tl.load(table_ptr + req * stride_t + col, mask=valid & (col < ncols), other=-1)
    epb = block_size // tokens_per_entry
    return tl.where(block >= 0, block * epb + (q // tokens_per_entry) % epb, -1)


@triton.jit
def _static_window_kernel(pos_ptr, table_ptr, req_ptr, token_ptr, window_ptr, stride_t, ncols, rows_per_request,
                          W, block_size, BLOCK_W: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Row ``program_id(0)``: its request, its token's slot and the slots of positions ``p - W + 1 .. p``."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t)
    req = t // rows_per_request
    tl.store(req_ptr + t, req)
    tl.store(token_ptr + t, _lookup(table_ptr, stride_t, ncols, req, p, block_size, 1))
    w = tl.arange(0, BLOCK_W)
    slots = _lookup(table_ptr, stride_t, ncols, req, p - (W - 1) + w, block_size, 1)
    tl.store(window_ptr + t * W + w, slots, mask=w < W)


@triton.jit
def _static_compression_kernel(
    pos_ptr, wtable_ptr, ctable_ptr, entry_ptr, entry_pos_ptr, src_ptr, cand_ptr, stride_w, ncols_w, stride_c,
    ncols_c, rows_per_request, ratio, L, C, block_size,
    OVERLAP: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Row ``program_id(0)``, candidate columns of chunk ``program_id(1)``; chunk 0 also writes the row's entry
    (the one closing at its token: ``(p + 1) % ratio == 0``), its position and its sources' window slots."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    p1 = tl.load(pos_ptr + t) + 1
    req = t // rows_per_request
    if cb == 0:
        live = (p1 % ratio == 0) & (p1 >= ratio)
        first = tl.where(live, p1 - ratio, -1)
        tl.store(entry_ptr + t, _lookup(ctable_ptr, stride_c, ncols_c, req, first, block_size, ratio))
        tl.store(entry_pos_ptr + t, tl.maximum(first, 0))
        s = tl.arange(0, BLOCK_L)
        if OVERLAP:  # the window before the entry's own too
            first_src = first - ratio
        else:
            first_src = first
        src = tl.where(live, first_src + s, -1)
        tl.store(
            src_ptr + t * L + s, _lookup(wtable_ptr, stride_w, ncols_w, req, src, block_size, 1), mask=s < L
        )
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    epb = block_size // ratio
    column = c // epb
    block = tl.load(ctable_ptr + req * stride_c + column, mask=(c < C) & (column < ncols_c), other=-1)
    slots = tl.where(c >= p1 // ratio, -1, block * epb + c % epb)
    tl.store(cand_ptr + t * C + c, slots, mask=c < C)


def static_plan(positions: torch.Tensor, window_table: torch.Tensor, compressed_table: torch.Tensor,
                rows_per_request: int, sliding_window: int, kinds: tuple[tuple[int, bool], ...],
                context_bucket: int, block_size: int):  # fmt: skip
    """``compose_static_plan`` in ``1 + len(kinds)`` launches (int64 positions and block tables)."""
    T, W, dev = positions.shape[0], sliding_window, positions.device
    pos = positions.long().contiguous()
    wt, ct = window_table.long().contiguous(), compressed_table.long().contiguous()
    req, token = (torch.empty(T, dtype=torch.int64, device=dev) for _ in range(2))
    window = torch.empty((T, W), dtype=torch.int64, device=dev)
    tables = []
    for ratio, overlap in kinds:
        span, width = 2 * ratio if overlap else ratio, context_bucket // ratio
        tables.append((
            torch.empty(T, dtype=torch.int64, device=dev), torch.empty(T, dtype=torch.int64, device=dev),
            torch.empty((T, span), dtype=torch.int64, device=dev), torch.empty((T, width), dtype=torch.int64, device=dev),
        ))  # fmt: skip
    if T == 0:
        return req, token, window, tables
    _static_window_kernel[(T,)](
        pos, wt, req, token, window, wt.stride(0), wt.shape[1], rows_per_request, W, block_size,
        BLOCK_W=pow2(W), num_warps=1, **dispatch.pdl_args(T),
    )  # fmt: skip
    for (ratio, overlap), (entry, entry_pos, src, cand) in zip(kinds, tables, strict=True):
        span, width = src.shape[1], cand.shape[1]
        block_c = min(pow2(max(width, 1)), 1024)
        _static_compression_kernel[(T, triton.cdiv(max(width, 1), block_c))](
            pos, wt, ct, entry, entry_pos, src, cand, wt.stride(0), wt.shape[1], ct.stride(0), ct.shape[1],
            rows_per_request, ratio, span, width, block_size,
            OVERLAP=overlap, BLOCK_L=pow2(span), BLOCK_C=block_c, num_warps=4 if block_c >= 512 else 1,
            **dispatch.pdl_args(T),
        )  # fmt: skip
    return req, token, window, tables
