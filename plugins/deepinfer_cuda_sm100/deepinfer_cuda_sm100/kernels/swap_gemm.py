"""Swap-AB grouped GEMM for quantized weights at decode: the weight tile on the MMA's M side.

At decode an expert sees a handful of rows. ``_grouped_gemm_kernel`` puts them on the MMA's M side
(16-64-row tiles, mostly padding) and multiplies every dequantised weight by its scale before the MMA.
Here the product is computed transposed, ``C.T = W @ A.T``: ``BLOCK_N`` weight rows are the M side, fed
from registers, and the tile's ``BLOCK_M`` rows are the N side. The weights enter the MMA as bare
float16 codes; scales multiply the float32 products after it, one multiply per product per scale
group instead of one per weight:

- FP4 e2m1 (``FMT=2``): codes by bit placement (``kernels/gemv.py``: the value times ``2**-14``). A
  32-wide K group is two K=16 MMAs, the low nibbles against the even activation columns and the high
  nibbles against the odd ones (nothing is interleaved), and the group's sum is scaled per weight row.
- FP8 block (``FMT=1``): e4m3 converts to float16 exactly; a ``BLOCK_K`` step (at most 128) lies in one
  128x128 scale block, so with ``BLOCK_N`` dividing 128 the step's scale is one number.

Activations enter the MMA as float16 too. So that none overflows or flushes, every K step multiplies
each row by the power of two that puts its largest magnitude in ``[2**13, 2**14)`` and divides it back
out of the products: exact, except values below ``2**-38`` of the step's largest, which flush to zero.

Schedule, weight tables, split-K partials and epilogue are the tensor-core kernel's
(:func:`grouped_gemm.grouped_gemm` launches this one when ``GemmConfig.swap`` is set).
"""

from __future__ import annotations

import triton
import triton.language as tl

from deepinfer_cuda_sm100.kernels._common import mma, pow2_scale, store_tile, weight_base, weight_tile
from deepinfer_cuda_sm100.kernels.gemv import e2m1_f16, fp4_scale


@triton.jit
def _x_cols(a_ptr, a_rows, rm, ks, K, stride_am):
    """Activations ``[len(ks), BLOCK_M]``: columns ``ks`` of the tile's rows, float32."""
    ptr = a_ptr + a_rows[None, :].to(tl.int64) * stride_am + ks[:, None]
    return tl.load(ptr, mask=rm[None, :] & (ks < K)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _fp4_group(
    base, s_base, n, nm, g, K, stride_wn, stride_sn, xe, xo, DOT_T: tl.constexpr, ALIGNED: tl.constexpr
):
    """Unscaled products ``[BLOCK_N, BLOCK_M]`` of 32-wide K group ``g``, and its scales ``[BLOCK_N]``
    times ``2**14``."""
    j = g * 16 + tl.arange(0, 16)
    b = weight_tile(base, n, stride_wn, j, nm, K // 2, ALIGNED)
    lo, hi = e2m1_f16(b)
    p = mma(lo.to(DOT_T), xe, tl.zeros([lo.shape[0], xe.shape[1]], dtype=tl.float32), DOT_T)
    p = mma(hi.to(DOT_T), xo, p, DOT_T)
    s = tl.load(s_base + n * stride_sn + g, mask=nm & (g * 32 + 0 * n < K), other=0)
    return p, fp4_scale(s)


@triton.jit
def _fp8_step(base, s_base, n, nm, n0, k0, ks, K, stride_wn, stride_sn, stride_sk, x, DOT_T: tl.constexpr,
              ALIGNED: tl.constexpr):  # fmt: skip
    """Unscaled products ``[BLOCK_N, BLOCK_M]`` of the K step at ``k0`` and the step's block scale."""
    w = weight_tile(base, n, stride_wn, ks, nm, K, ALIGNED)
    p = mma(w.to(DOT_T), x, tl.zeros([w.shape[0], x.shape[1]], dtype=tl.float32), DOT_T)
    return p, tl.load(s_base + (n0 // 128) * stride_sn + (k0 // 128) * stride_sk).to(tl.float32)


@triton.jit
def _swap_gemm_kernel(
    a_ptr, a_idx_ptr, c_ptr, c_idx_ptr, row_w_ptr,
    w_tab, s_tab, up_tab, up_s_tab,
    tile_expert_ptr, tile_start_ptr, tile_end_ptr,
    N, K, stride_am, stride_cm, stride_wn, stride_sn, stride_sk, limit,
    ws_ptr, R, k_per_split,
    FMT: tl.constexpr, W_T: tl.constexpr, S_T: tl.constexpr, DOT_T: tl.constexpr,
    GATED: tl.constexpr, HAS_A_IDX: tl.constexpr, HAS_C_IDX: tl.constexpr, HAS_ROW_W: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ALIGNED: tl.constexpr,
):  # fmt: skip
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
    n0 = tl.program_id(1) * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    nm = n < N
    w_base = weight_base(w_tab, ex, W_T, ALIGNED)
    s_base = tl.load(s_tab + ex).to(tl.pointer_type(S_T))
    up_base = weight_base(up_tab, ex, W_T, ALIGNED)
    up_s_base = tl.load(up_s_tab + ex).to(tl.pointer_type(S_T))
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # C transposed
    acc2 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if FMT == 2:
            for gi in tl.static_range(BLOCK_K // 32):
                ke = k0 + gi * 32 + 2 * tl.arange(0, 16)
                xe = _x_cols(a_ptr, a_rows, rm, ke, K, stride_am)
                xo = _x_cols(a_ptr, a_rows, rm, ke + 1, K, stride_am)
                f, inv = pow2_scale(tl.maximum(tl.max(tl.abs(xe), axis=0), tl.max(tl.abs(xo), axis=0)))
                xe = (xe * f[None, :]).to(DOT_T)
                xo = (xo * f[None, :]).to(DOT_T)
                g = k0 // 32 + gi
                p, s = _fp4_group(w_base, s_base, n, nm, g, K, stride_wn, stride_sn, xe, xo, DOT_T, ALIGNED)
                acc += p * (s[:, None] * inv[None, :])
                if GATED:
                    p2, s2 = _fp4_group(
                        up_base, up_s_base, n, nm, g, K, stride_wn, stride_sn, xe, xo, DOT_T, ALIGNED
                    )
                    acc2 += p2 * (s2[:, None] * inv[None, :])
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            x = _x_cols(a_ptr, a_rows, rm, ks, K, stride_am)
            f, inv = pow2_scale(tl.max(tl.abs(x), axis=0))
            x = (x * f[None, :]).to(DOT_T)
            p, s = _fp8_step(
                w_base, s_base, n, nm, n0, k0, ks, K, stride_wn, stride_sn, stride_sk, x, DOT_T, ALIGNED
            )
            acc += p * (s * inv)[None, :]
            if GATED:
                p2, s2 = _fp8_step(up_base, up_s_base, n, nm, n0, k0, ks, K, stride_wn, stride_sn, stride_sk, x,
                                   DOT_T, ALIGNED)  # fmt: skip
                acc2 += p2 * (s2 * inv)[None, :]
    store_tile(tl.trans(acc), tl.trans(acc2), rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, ws_ptr, R, N,
               stride_cm, limit, GATED, HAS_C_IDX, HAS_ROW_W, SPLIT_K)  # fmt: skip


def swap_dot_dtype(interpreting: bool):
    """Float16 operands on a GPU; float32 under the interpreter (codes and scaled activations are exact in
    both, and the interpreter's half-precision ``tl.dot`` is not the tensor cores')."""
    return tl.float32 if interpreting else tl.float16
