"""MoE tile schedule in one launch, for decode-sized problems.

``grouped_gemm.tile_schedule`` builds the schedule from ~15 torch kernels (sort, histogram, cumsums,
searchsorted, gathers), and the MoE op adds ~7 more around it (the global -> local expert lookup, the
gathered routing weights, the source rows). At batch 1 those are ~22 launches of 1-3 us per MoE layer.
Here one program does all of it for up to :data:`MAX_ROWS` (token, slot) rows, with the same results:

- rows sorted stably by local expert (key ``expert * BLOCK_R + row``, one ``tl.sort``), rows of experts
  another rank owns after every local one;
- per-expert counts by ``tl.histogram``, tile counts and their running sums by ``tl.cumsum``;
- each tile's expert by counting the experts whose tiles end at or before it (a searchsorted), the
  per-expert starts read back from a small scratch buffer.

One-row tiles (``block_m`` 1, the decode GEMV) skip all of the per-expert part: tile ``t`` is sorted row ``t``
(``[t, t + 1)``), its expert the sorted key. At batch 1 that is a 16-entry sort instead of a 512-bin
histogram, two scans and a 64 x 512 search.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pow2

MAX_ROWS = 4096  # (token, slot) rows one program sorts; larger problems use the torch schedule
_TILE_CHUNK = 64


@triton.jit
def _schedule_kernel(ids_ptr, lut_ptr, w_ptr, order_ptr, a_idx_ptr, row_w_ptr, t_exp_ptr, t_start_ptr, t_end_ptr,
                     scratch_ptr, R, LUT_N, E, K, NT, BLOCK_M,
                     BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, ONE_ROW: tl.constexpr = False,
                     PDL: tl.constexpr = False):  # fmt: skip
    pdl_enter(PDL)
    r = tl.arange(0, BLOCK_R)
    rm = r < R
    gid = tl.load(ids_ptr + r, mask=rm, other=-1)
    known = (gid >= 0) & (gid < LUT_N)
    loc = tl.load(lut_ptr + tl.where(known, gid, 0), mask=rm & known, other=-1)
    key = tl.where(rm, tl.where(loc < 0, E, loc), E + 1).to(tl.int32)
    srt = tl.sort(key * BLOCK_R + r)
    order = srt % BLOCK_R
    tl.store(order_ptr + r, order.to(tl.int64), mask=rm)
    tl.store(a_idx_ptr + r, (order // K).to(tl.int64), mask=rm)
    tl.store(row_w_ptr + r, tl.load(w_ptr + order, mask=rm, other=0.0).to(tl.float32), mask=rm)
    if ONE_ROW:  # tile t = sorted row t (NT == R)
        row_ex = srt // BLOCK_R
        tl.store(t_exp_ptr + r, tl.where(row_ex < E, row_ex, -1).to(tl.int64), mask=rm)
        tl.store(t_start_ptr + r, r.to(tl.int64), mask=rm)
        tl.store(t_end_ptr + r, (r + 1).to(tl.int64), mask=rm)
        return
    e = tl.arange(0, BLOCK_E)
    em = e < E
    counts = tl.where(em, tl.histogram(key, BLOCK_E), 0)
    ends = tl.cumsum(counts, 0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_ends = tl.cumsum(tiles, 0)
    tl.store(scratch_ptr + e, ends - counts)
    tl.store(scratch_ptr + BLOCK_E + e, ends)
    tl.store(scratch_ptr + 2 * BLOCK_E + e, tile_ends - tiles)
    tl.debug_barrier()
    for t0 in range(0, NT, CHUNK):
        tid = t0 + tl.arange(0, CHUNK)
        ex = tl.sum(((tile_ends[None, :] <= tid[:, None]) & em[None, :]).to(tl.int32), axis=1)
        used = ex < E
        exc = tl.minimum(ex, E - 1)
        start = tl.load(scratch_ptr + exc) + (tid - tl.load(scratch_ptr + 2 * BLOCK_E + exc)) * BLOCK_M
        tm = tid < NT
        tl.store(t_exp_ptr + tid, tl.where(used, ex, -1).to(tl.int64), mask=tm)
        tl.store(t_start_ptr + tid, start.to(tl.int64), mask=tm)
        tl.store(t_end_ptr + tid, tl.load(scratch_ptr + BLOCK_E + exc).to(tl.int64), mask=tm)


def moe_schedule(ids: torch.Tensor, lut: torch.Tensor, weights: torch.Tensor, num_experts: int, block_m: int):
    """``ids [T, k]`` global expert ids, ``lut`` global -> local (``-1``: another rank's), ``weights [T, k]``.

    Returns ``(order, a_idx, row_w, tile_expert, tile_start, tile_end)`` as ``grouped_gemm.tile_schedule``
    (with ``order // k`` and ``weights.flatten()[order]`` as float32; one-row tiles end after their row rather
    than at their expert's end), or ``None`` above :data:`MAX_ROWS`."""
    T, k = ids.shape
    R = T * k
    if R == 0 or R > MAX_ROWS:
        return None
    dev = ids.device
    nt = min(triton.cdiv(R, block_m) + num_experts, R)
    i64 = dict(dtype=torch.int64, device=dev)
    order, a_idx = torch.empty(R, **i64), torch.empty(R, **i64)
    row_w = torch.empty(R, dtype=torch.float32, device=dev)
    t_exp, t_start, t_end = (torch.empty(nt, **i64) for _ in range(3))
    block_e = pow2(num_experts + 2)
    scratch = torch.empty(3 * block_e, dtype=torch.int32, device=dev)
    _schedule_kernel[(1,)](
        ids.reshape(-1).contiguous(), lut, weights.reshape(-1).contiguous(), order, a_idx, row_w, t_exp, t_start,
        t_end, scratch, R, lut.numel(), num_experts, k, nt, block_m,
        BLOCK_R=pow2(R, 16), BLOCK_E=block_e, CHUNK=_TILE_CHUNK, ONE_ROW=block_m == 1, num_warps=4,
        **dispatch.pdl_args(T),
    )  # fmt: skip
    return order, a_idx, row_w, t_exp, t_start, t_end
