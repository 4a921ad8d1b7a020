"""Grouped GEMM over experts with in-kernel weight dequantisation (BF16, FP8 block, FP4 e2m1).

``C[r] = A[a_idx[r]] @ W_{e(r)}.T`` for rows ``r`` sorted by expert. The schedule is a list of
``BLOCK_M``-row tiles, each inside one expert's contiguous row range (built on the device with no
host sync, so it can be graph-captured). Expert weights are *not* stacked: the kernel reads each
expert's base address from a table of ``data_ptr()`` values, so the model's per-expert tensors are
used in place. All experts of one table share shape, strides and format.

Formats (see :class:`deepinfer_core.ops.weights.QuantizedWeight`):

- ``FMT=0``: plain ``[N, K]`` (bf16/f16/f32), loaded and fed to the tensor cores as is.
- ``FMT=1``: ``float8_e4m3fn [N, K]`` with one float32 scale per ``SB x SB`` block: ``SB`` 128 (V4's
  ``fp8_block``) or 32 (V4.1's ``fp8_block32``). A K step of at most 128 lies in one 128-wide scale block,
  so each tile is ``(W_e4m3 * scale[n // 128]) -> bf16``; with 32-wide blocks a step spans
  ``BLOCK_K / 32`` of them and each 32-column slice takes its own scale (exact for ue8m0 scales either way:
  e4m3 values times a power of two fit bf16).
- ``FMT=2``: e2m1 codes packed two per byte (low nibble first), one ue8m0 scale per 32 inputs (read
  as its exponent byte, :func:`ue8m0_bytes`, or as float32). On a GPU codes are decoded and scaled
  by inline PTX straight into bf16 (``gemv.e2m1_bf16_scaled``, ``dispatch.fp4_decode_ptx``); else by
  bit placement into float16 (``kernels/gemv.py``) or by integer ops to 4x their value (exact), then
  scaled per 32 and rounded to bf16 (exact: at most 2 significant bits times a power of two).

``GATED`` computes the gate (``w1``) and up (``w3``) products of a tile together and writes
``silu(min(g, limit)) * clamp(u, -limit, limit)``; otherwise ``C`` rows may be scaled by a per-row
weight and scattered to ``c_idx[r]`` (the down projection of the MoE).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepinfer_core.plugin_api import QuantizedWeight, Weight
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import (
    COUNTERS,
    TL_DTYPE,
    arrival_counters,
    dot_dtype,
    epilogue,
    interpreting,
    mma,
    pdl_enter,
    scale_f32,
    store_tile,
    weight_base,
    weight_tile,
)
from deepinfer_cuda_sm100.kernels.gemv import (
    _grouped_gemv_kernel,
    e2m1_bf16_scaled,
    e2m1_halves,
    e8m0_bf16_unit,
)

FORMATS = {"plain": 0, "fp8_block": 1, "fp8_block32": 1, "fp4_e2m1": 2}
#: the FP8 formats' scale block (rows and columns)
SCALE_BLOCK = {"fp8_block": 128, "fp8_block32": 32}


@triton.jit
def _load_w(w_base, s_base, n, nm, k0, K, stride_wn, stride_sn, stride_sk,
            FMT: tl.constexpr, DOT_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
            FP4_BITS: tl.constexpr, FP4_ASM: tl.constexpr, ALIGNED: tl.constexpr, SB: tl.constexpr):  # fmt: skip
    """The dequantised ``[BLOCK_N, BLOCK_K]`` weight tile in ``DOT_T``.

    Scales are folded into the tile before the MMA, as the reference does when it dequantises to
    the activation dtype; with ue8m0 (power-of-two) scales the product is exact in bf16. ``FP4_ASM``:
    bf16 FP4 tiles decoded and scaled by :func:`gemv.e2m1_bf16_scaled` (PTX, packed bf16x2)."""
    ks = k0 + tl.arange(0, BLOCK_K)
    m = nm[:, None] & (ks < K)[None, :]
    if FMT == 2:
        # Bytes [BLOCK_N, BLOCK_K/2] -> codes interleaved back into K order (low nibble first).
        # (v2 tried one byte address per element instead: 5x slower on the H200, NOTES.md.)
        kh = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        b = weight_tile(w_base, n, stride_wn, kh, nm, K // 2, ALIGNED)
        g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        sc = tl.load(
            s_base + n[:, None] * stride_sn + g[None, :],
            mask=nm[:, None] & (g < tl.cdiv(K, 32))[None, :],
            other=0,
        )
        if FP4_ASM:
            s = tl.reshape(tl.broadcast_to(e8m0_bf16_unit(sc)[:, :, None], (BLOCK_N, BLOCK_K // 32, 16)),
                           (BLOCK_N, BLOCK_K // 2))  # fmt: skip
            lo, hi = e2m1_bf16_scaled(b, s)
            return tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
        if FP4_BITS:  # bit placement into float16 (kernels/gemv.py): values x 2**-14
            lo, hi = e2m1_halves(b)
            val = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
            unit = 16384.0
        else:  # integer arithmetic: 4x the magnitude, then the sign (v1-v5)
            b = b.to(tl.int32)
            v = tl.reshape(tl.join(b & 15, b >> 4), (BLOCK_N, BLOCK_K))
            e = (v >> 1) & 3
            mant = v & 1
            mag4 = tl.where(e == 0, 2 * mant, (2 + mant) << e)
            val = tl.where((v & 8) != 0, -mag4, mag4).to(tl.float32)
            unit = 0.25
        val = tl.reshape(
            tl.reshape(val, (BLOCK_N, BLOCK_K // 32, 32)) * (scale_f32(sc) * unit)[:, :, None],
            (BLOCK_N, BLOCK_K),
        )
        return val.to(DOT_T)
    else:
        if FMT == 1:
            w = weight_tile(w_base, n, stride_wn, ks, nm, K, ALIGNED)
            if SB >= BLOCK_K:  # the step lies in one scale block per row
                s = tl.load(s_base + (n // SB) * stride_sn + (k0 // SB) * stride_sk, mask=nm, other=0.0)
                return (w.to(tl.float32) * s[:, None]).to(DOT_T)
            else:  # BLOCK_K / SB scale blocks per row: each SB-wide slice times its own scale
                g = k0 // SB + tl.arange(0, BLOCK_K // SB)
                s = tl.load(s_base + (n // SB)[:, None] * stride_sn + g[None, :] * stride_sk,
                            mask=nm[:, None] & (g < tl.cdiv(K, SB))[None, :], other=0.0)  # fmt: skip
                w = tl.reshape(w.to(tl.float32), (BLOCK_N, BLOCK_K // SB, SB)) * s[:, :, None]
                return tl.reshape(w, (BLOCK_N, BLOCK_K)).to(DOT_T)
        w = tl.load(w_base + n[:, None] * stride_wn + ks[None, :], mask=m, other=0.0)
        return w.to(DOT_T)


@triton.jit
def _mma_step(acc, a, w_base, s_base, n, nm, k0, K, stride_wn, stride_sn, stride_sk,
              FMT: tl.constexpr, DOT_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
              FP4_BITS: tl.constexpr, FP4_ASM: tl.constexpr, ALIGNED: tl.constexpr, SB: tl.constexpr,
              SWAP_AB: tl.constexpr = False):  # fmt: skip
    """One K step into ``acc``: ``[BLOCK_M, BLOCK_N]``, or with ``SWAP_AB`` its transpose ``[BLOCK_N, BLOCK_M]``,
    the dequantised weight tile then being the MMA's left operand (on SM90 wgmma takes that one straight from
    registers, so the decoded tile is not stored to shared memory first)."""
    w = _load_w(w_base, s_base, n, nm, k0, K, stride_wn, stride_sn, stride_sk, FMT, DOT_T, BLOCK_K, BLOCK_N,
                FP4_BITS, FP4_ASM, ALIGNED, SB)  # fmt: skip
    if SWAP_AB:
        return mma(w, tl.trans(a), acc, DOT_T)
    return mma(a, tl.trans(w), acc, DOT_T)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, a_idx_ptr, c_ptr, c_idx_ptr, row_w_ptr, add_ptr,
    w_tab, s_tab, up_tab, up_s_tab,
    tile_expert_ptr, tile_start_ptr, tile_end_ptr,
    N, K, stride_am, stride_cm, stride_wn, stride_sn, stride_sk, limit,
    ws_ptr, cnt_ptr, R, k_per_split,
    FMT: tl.constexpr, W_T: tl.constexpr, S_T: tl.constexpr, DOT_T: tl.constexpr,
    GATED: tl.constexpr, HAS_A_IDX: tl.constexpr, HAS_C_IDX: tl.constexpr, HAS_ROW_W: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ALIGNED: tl.constexpr, FP4_BITS: tl.constexpr, FP4_ASM: tl.constexpr,
    FINISH: tl.constexpr = False, SB: tl.constexpr = 128, HAS_ADD: tl.constexpr = False,
    SWAP_AB: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
    tile = tl.program_id(0)
    ex = tl.load(tile_expert_ptr + tile)
    if ex < 0:
        return
    r0 = tl.load(tile_start_ptr + tile)
    r1 = tl.load(tile_end_ptr + tile)
    rows = r0 + tl.arange(0, BLOCK_M)
    rm = rows < r1
    if HAS_A_IDX:
        a_rows = tl.load(a_idx_ptr + rows, mask=rm, other=0)
    else:
        a_rows = rows
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    w_base = weight_base(w_tab, ex, W_T, ALIGNED)
    s_base = tl.load(s_tab + ex).to(tl.pointer_type(S_T))
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GATED:
        up_base = weight_base(up_tab, ex, W_T, ALIGNED)
        up_s_base = tl.load(up_s_tab + ex).to(tl.pointer_type(S_T))
    ks = tl.arange(0, BLOCK_K)
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = tl.load(a_ptr + a_rows[:, None].to(tl.int64) * stride_am + k0 + ks[None, :],
                    mask=rm[:, None] & (k0 + ks < K)[None, :], other=0.0).to(DOT_T)  # fmt: skip
        acc = _mma_step(acc, a, w_base, s_base, n, nm, k0, K, stride_wn, stride_sn, stride_sk, FMT, DOT_T, BLOCK_K,
                        BLOCK_N, FP4_BITS, FP4_ASM, ALIGNED, SB, SWAP_AB)  # fmt: skip
        if GATED:
            acc2 = _mma_step(acc2, a, up_base, up_s_base, n, nm, k0, K, stride_wn, stride_sn, stride_sk, FMT, DOT_T,
                             BLOCK_K, BLOCK_N, FP4_BITS, FP4_ASM, ALIGNED, SB, SWAP_AB)  # fmt: skip
    if SWAP_AB:
        acc = tl.trans(acc)
        acc2 = tl.trans(acc2)
    store_tile(acc, acc2, rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, ws_ptr, cnt_ptr, R, N, stride_cm,
               limit, GATED, HAS_C_IDX, HAS_ROW_W, SPLIT_K, FINISH, HAS_ADD)  # fmt: skip


@triton.jit
def _dequant_kernel(w_tab, s_tab, ex_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_sk, stride_oe, stride_on,
                    FMT: tl.constexpr, W_T: tl.constexpr, S_T: tl.constexpr, DOT_T: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP4_BITS: tl.constexpr, FP4_ASM: tl.constexpr,
                    ALIGNED: tl.constexpr, SB: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """``out[i] = `` expert ``ex_ptr[i]``'s weight in ``DOT_T``, tile by tile through :func:`_load_w`: the operand
    values the tensor-core kernel multiplies, bit for bit."""
    pdl_enter(PDL)
    i = tl.program_id(2)
    ex = tl.load(ex_ptr + i)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    k0 = tl.program_id(1) * BLOCK_K
    w_base = weight_base(w_tab, ex, W_T, ALIGNED)
    s_base = tl.load(s_tab + ex).to(tl.pointer_type(S_T))
    w = _load_w(w_base, s_base, n, nm, k0, K, stride_wn, stride_sn, stride_sk, FMT, DOT_T, BLOCK_K, BLOCK_N,
                FP4_BITS, FP4_ASM, ALIGNED, SB)  # fmt: skip
    ks = k0 + tl.arange(0, BLOCK_K)
    dst = out_ptr + i.to(tl.int64) * stride_oe + n[:, None].to(tl.int64) * stride_on + ks[None, :]
    tl.store(dst, w, mask=nm[:, None] & (ks < K)[None, :])


def dequantize(table: WeightTable, dtype: torch.dtype, experts: torch.Tensor | None = None,
               out: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:  # fmt: skip
    """The table's weights (``experts``: their indices in the table, an int32 device tensor; default all) as
    ``[len(experts), N, K]`` of ``dtype`` (bf16 or float16): the values the tensor-core kernel feeds its MMA, for
    a library GEMM at prefill sizes (``dispatch.dequant_gemm``). ``rows``: the GEMM's activation rows, for
    :func:`dispatch.pdl_args` (``None``: a prefill's many). Under the interpreter, whose casts to bf16
    truncate where a GPU's round to nearest even, the kernel writes float32 and torch rounds."""
    if experts is None:
        experts = torch.arange(table.ptrs.numel(), dtype=torch.int32, device=table.ptrs.device)
    e = experts.numel()
    out = torch.empty((e, table.n, table.k), dtype=dtype, device=table.ptrs.device) if out is None else out
    if e == 0:
        return out
    if interpreting() and dtype != torch.float32:
        return out.copy_(dequantize(table, torch.float32, experts, rows=rows))
    bn, bk = 64, 128 if table.k % 128 == 0 else 64
    aligned = table.aligned and table.k % bk == 0
    asm = table.fmt == 2 and dispatch.fp4_decode_ptx(dtype, [table.scale_bytes])
    _dequant_kernel[(triton.cdiv(table.n, bn), triton.cdiv(table.k, bk), e)](
        table.ptrs, table.scale_ptrs, experts, out, table.n, table.k, table.stride_wn, table.stride_sn,
        table.stride_sk, out.stride(0), out.stride(1), FMT=table.fmt, W_T=TL_DTYPE[table.w_dtype],
        S_T=TL_DTYPE[table.s_dtype], DOT_T=TL_DTYPE[dtype], BLOCK_N=bn, BLOCK_K=bk, FP4_BITS=True, FP4_ASM=asm,
        ALIGNED=aligned, SB=table.scale_block, num_warps=4,
        **dispatch.pdl_args(rows if rows is not None else dispatch.PDL_MAX_TOKENS + 1),
    )  # fmt: skip
    return out


@dataclass
class WeightTable:
    """Per-expert base addresses of one projection (``w1``, ``w3`` or ``w2``) and their common layout.

    Holds references to the tensors so the addresses stay valid while the table lives."""

    fmt: int
    n: int
    k: int
    ptrs: torch.Tensor
    scale_ptrs: torch.Tensor
    w_dtype: torch.dtype
    s_dtype: torch.dtype
    stride_wn: int
    stride_sn: int
    stride_sk: int
    keep: list
    #: FP4 with ue8m0 scale bytes: the smallest and largest byte (for ``dispatch.fp4_decode_ptx``)
    scale_bytes: tuple[int, int] | None = None
    #: weights whose rows all start 16-byte aligned (``_common.weight_tile``, ``gemv._row_tile``)
    aligned: bool = False
    #: FP8: rows and columns one scale covers (:data:`SCALE_BLOCK`)
    scale_block: int = 128

    @staticmethod
    def build(weights: list[Weight], device: torch.device) -> WeightTable:
        first = weights[0]
        if isinstance(first, QuantizedWeight):
            datas = [w.data for w in weights]
            scales = [w.scale for w in weights]
            fmt, (n, k) = FORMATS[first.format], first.shape
            if any(not isinstance(w, QuantizedWeight) or w.format != first.format for w in weights):
                raise ValueError("all experts of one projection must share one weight format")
        else:
            datas, scales = list(weights), list(weights)
            fmt, (n, k) = 0, first.shape
        if fmt == 2:
            scales = ue8m0_bytes(scales)
        for t in datas + scales:
            if t.stride(-1) != 1:
                raise ValueError("expert weights must be row-major (last stride 1)")
        if any(t.shape != datas[0].shape or t.stride() != datas[0].stride() for t in datas):
            raise ValueError("all experts of one projection must share shape and strides")
        ptrs = torch.tensor([t.data_ptr() for t in datas], dtype=torch.int64, device=device)
        sptrs = torch.tensor([t.data_ptr() for t in scales], dtype=torch.int64, device=device)
        s0 = scales[0]
        sb = SCALE_BLOCK.get(first.format, 128) if isinstance(first, QuantizedWeight) else 128
        return WeightTable(fmt, n, k, ptrs, sptrs, datas[0].dtype, s0.dtype, datas[0].stride(0), s0.stride(0),
                           s0.stride(-1) if s0.dim() > 1 else 1, datas + scales,
                           byte_range(scales) if fmt == 2 else None, aligned16(datas), sb)  # fmt: skip


def ue8m0_bytes(scales: list[torch.Tensor]) -> list[torch.Tensor]:
    """FP4 scales as their ue8m0 bytes (the float32 exponent field, ``uint8``), which the kernels read
    instead of float32 (17 bytes per 32 weights, not 20), when every scale is a power of two in
    ``[2**-126, 2**127]``; else ``scales`` unchanged. A copy: the model keeps its own. Checks on the host
    once, when the table is built (never inside graph capture)."""
    if any(s.dtype != torch.float32 for s in scales):
        return scales
    bits = [s.contiguous().view(torch.int32) for s in scales]
    ok = torch.stack([(((b & 0x807FFFFF) == 0) & ((b >> 23) > 0)).all() for b in bits])
    if not bool(ok.all()):
        return scales
    return [(b >> 23).to(torch.uint8) for b in bits]


def byte_range(scales: list[torch.Tensor]) -> tuple[int, int] | None:
    """The smallest and largest ue8m0 scale byte (None: float32 scales). One host sync, at table build."""
    if any(s.dtype != torch.uint8 for s in scales):
        return None
    lo_hi = torch.stack([torch.stack([s.min(), s.max()]) for s in scales])
    return int(lo_hi[:, 0].min()), int(lo_hi[:, 1].max())


def aligned16(datas: list[torch.Tensor]) -> bool:
    """Every tensor starts 16-byte aligned with 16-byte-aligned rows."""
    return all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0 for t in datas)


def tile_schedule(local_ids: torch.Tensor, num_experts: int, block_m: int):
    """Sort rows by expert and cut each expert's rows into ``block_m`` tiles, all on the device.

    ``local_ids [R]`` (``-1``: not computed here). Returns ``(order, tile_expert, tile_start, tile_end)``:
    row ``i`` of the sorted problem is source row ``order[i]``; tile ``j`` covers sorted rows
    ``[tile_start[j], tile_end[j])`` of expert ``tile_expert[j]`` (``-1``: an unused tile). The tile count
    is the static bound ``min(cdiv(R, block_m) + num_experts, R)`` (each tile holds a row), so nothing
    here waits for the device.
    """
    dev = local_ids.device
    key = torch.where(local_ids < 0, num_experts, local_ids)
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    tiles = (counts + block_m - 1) // block_m
    tile_ends = torch.cumsum(tiles, 0)
    n_tiles = min(triton.cdiv(local_ids.numel(), block_m) + num_experts, local_ids.numel())
    tid = torch.arange(n_tiles, device=dev)
    ex = torch.searchsorted(tile_ends, tid, right=True)
    used = ex < num_experts
    exc = ex.clamp(max=num_experts - 1)
    t_start = starts[exc] + (tid - (tile_ends[exc] - tiles[exc])) * block_m
    t_end = ends[exc]
    return order, torch.where(used, ex, -1), t_start, t_end


@triton.jit
def _splitk_epilogue_kernel(
    ws_ptr, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, R, N, stride_cm, limit,
    SPLIT_K: tl.constexpr, GATED: tl.constexpr, HAS_C_IDX: tl.constexpr, HAS_ROW_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_ADD: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """Sum the ``SPLIT_K`` partials of sorted row ``program_id(0)`` in a fixed order (deterministic), then
    the epilogue of :func:`_grouped_gemm_kernel`: SwiGLU, row weight, scatter, cast."""
    pdl_enter(PDL)
    rows = tl.program_id(0) + tl.arange(0, 1)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    stride = (2 if GATED else 1) * R * N
    off = rows[:, None].to(tl.int64) * N + n[None, :]
    acc = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + s * stride + off, mask=nm[None, :], other=0.0)
        if GATED:
            acc2 += tl.load(ws_ptr + s * stride + R * N + off, mask=nm[None, :], other=0.0)
    epilogue(acc, acc2, rows, rows < R, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, stride_cm, limit, GATED,
             HAS_C_IDX, HAS_ROW_W, HAS_ADD)  # fmt: skip


def grouped_gemm(
    a: torch.Tensor,
    table: WeightTable,
    sched: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    cfg: dispatch.GemmConfig,
    *,
    a_idx: torch.Tensor | None = None,
    c_idx: torch.Tensor | None = None,
    row_w: torch.Tensor | None = None,
    gate_table: WeightTable | None = None,
    limit: float = 0.0,
    all_rows_tiled: bool = False,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch one grouped GEMM. With ``gate_table`` (``w1``), ``table`` is ``w3`` and the result is the
    clamped SwiGLU of the two. ``out`` rows are indexed by sorted row, or by ``c_idx`` when given.
    ``all_rows_tiled``: every sorted row lies in some tile (a dense grouped linear, experts when this rank
    holds them all), so a split-K workspace needs no zeroing, and the last K slice of each tile may finish it
    (``dispatch.split_finish``: no epilogue launch). ``add``: a tensor laid out as ``out`` whose elements are added
    to the cast result and rounded again (``epilogue``'s ``HAS_ADD``; rows by sorted row, no ``c_idx``)."""
    tile_expert, tile_start, tile_end = sched
    if add is not None and (c_idx is not None or add.shape != out.shape or add.stride() != out.stride()):
        raise ValueError("add must be laid out as out, and rows are not scattered (c_idx) when it is given")
    if cfg.gemv and table.fmt == 1 and table.scale_block % cfg.block_n:
        raise ValueError(f"GEMV block_n {cfg.block_n} must divide the FP8 scale block {table.scale_block}")
    first = gate_table if gate_table is not None else table
    gated = gate_table is not None
    split = max(1, min(cfg.split_k, triton.cdiv(table.k, cfg.block_k)))
    k_per_split = triton.cdiv(triton.cdiv(table.k, split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(table.k, k_per_split)
    rows = a_idx.numel() if a_idx is not None else a.shape[0]  # rows of the sorted problem
    ws = out
    if (
        split > 1
    ):  # MoE (gathered or scattered rows): zeros, as rows no tile covers (other ranks' experts) sum to 0
        alloc = (
            torch.zeros if (a_idx is not None or c_idx is not None) and not all_rows_tiled else torch.empty
        )
        ws = alloc((split, 2 if gated else 1, rows, table.n), dtype=torch.float32, device=a.device)
    grid = (tile_expert.numel(), triton.cdiv(table.n, cfg.block_n), split)
    aligned = table.aligned and first.aligned and table.k % cfg.block_k == 0
    tiled = all_rows_tiled or (a_idx is None and c_idx is None)
    finish = split > 1 and tiled and dispatch.split_finish(cfg) and grid[0] * grid[1] <= COUNTERS
    cnt = arrival_counters(a.device) if finish else ws
    args = (
        a, a_idx if a_idx is not None else tile_start, out, c_idx if c_idx is not None else tile_start,
        row_w if row_w is not None else out, add if add is not None else out,
        first.ptrs, first.scale_ptrs, table.ptrs, table.scale_ptrs,
        tile_expert, tile_start, tile_end,
        table.n, table.k, a.stride(0), out.stride(0), table.stride_wn, table.stride_sn, table.stride_sk, limit,
        ws, cnt, rows, k_per_split,
    )  # fmt: skip
    meta = dict(
        FMT=table.fmt, W_T=TL_DTYPE[table.w_dtype], S_T=TL_DTYPE[table.s_dtype],
        GATED=gated, HAS_A_IDX=a_idx is not None, HAS_C_IDX=c_idx is not None,
        HAS_ROW_W=row_w is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SPLIT_K=split, ALIGNED=aligned, FINISH=finish, SB=table.scale_block, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, HAS_ADD=add is not None,
    )  # fmt: skip
    if cfg.gemv:  # float32 FMAs: the PTX decode's bf16 weights are exact for any activation dtype
        ptx = cfg.fp4_asm and dispatch.fp4_decode_ptx(None, [first.scale_bytes, table.scale_bytes])
        _grouped_gemv_kernel[grid](
            *args, FP4_ASM=ptx, EVEN_N=table.n % cfg.block_n == 0,
            FP4_H2=dispatch.fp4_h2_mode(cfg, table.fmt == 2, a.dtype, aligned), **meta,
            **dispatch.pdl_args(a.shape[0]),
        )  # fmt: skip
    else:
        asm = cfg.fp4_asm and dispatch.fp4_decode_ptx(a.dtype, [first.scale_bytes, table.scale_bytes])
        _grouped_gemm_kernel[grid](*args, DOT_T=dot_dtype(a.dtype), FP4_BITS=cfg.fp4_bits, FP4_ASM=asm,
                                   SWAP_AB=cfg.swap_ab, **meta, **dispatch.pdl_args(a.shape[0]))  # fmt: skip
    if split > 1 and rows and not finish:
        bn = min(1024, triton.next_power_of_2(table.n))
        _splitk_epilogue_kernel[(rows, triton.cdiv(table.n, bn))](
            ws, out, c_idx if c_idx is not None else tile_start, row_w if row_w is not None else out,
            add if add is not None else out, rows, table.n, out.stride(0), limit,
            SPLIT_K=split, GATED=gated, HAS_C_IDX=c_idx is not None, HAS_ROW_W=row_w is not None,
            BLOCK_N=bn, num_warps=4, HAS_ADD=add is not None, **dispatch.pdl_args(a.shape[0]),
        )  # fmt: skip
    return out
