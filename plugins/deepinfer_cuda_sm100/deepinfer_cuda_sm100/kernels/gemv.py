"""Decode-shaped grouped GEMM ("GEMV"): a few rows per expert, weights streamed through the CUDA cores.

At decode an expert, or a dense projection, sees 1-8 rows. The tensor-core kernel of
:mod:`~deepinfer_cuda_sm100.kernels.grouped_gemm` pads them to 16-64-row tiles and stages every
dequantised weight tile through shared memory. Here each program streams a ``[BLOCK_N, BLOCK_K]``
weight tile into registers, dequantises it there and reduces it against each of the tile's
``BLOCK_M`` (at most 8) rows with FMAs. Schedule, weight tables, split-K partials and epilogue are
the tensor-core kernel's, so :func:`grouped_gemm.grouped_gemm` picks either by ``GemmConfig.gemv``.

Formats, as in ``grouped_gemm``:

- plain: the tile in float32.
- FP8 block: ``BLOCK_N`` divides the scale block ``SB`` (128, or 32 for ``fp8_block32``), so a program's
  rows share one scale row; the per-K scale multiplies the activation instead of the tile.
- FP4 e2m1: bit placement, not arithmetic: a nibble's sign goes to bit 15 and its exponent and
  mantissa (3 bits) to bits 11..9 of a float16, which is the code's value times ``2**-14`` for
  every code (float16's subnormals 0 and 2**-15 are e2m1's 0 and 0.5). The ``2**14`` rides on the
  per-32 scale. The low and high nibbles of a byte are the even and odd K positions and are reduced
  against the even and odd activation columns, so codes are never interleaved back. On a GPU
  (``dispatch.fp4_decode_ptx``) the codes are instead decoded and scaled by inline PTX into bf16
  (:func:`e2m1_bf16_scaled`, shared with the tensor-core kernel), four instructions per pair of codes.
  One-row tiles with bf16 or float16 activations multiply in float16 pairs instead
  (:mod:`~deepinfer_cuda_sm100.kernels.fp4_pairs`, ``FP4_H2``).
- Plain one-row tiles accumulate whole ``[BLOCK_N, BLOCK_K]`` tiles and reduce once (a 16-byte load holds
  4-8 K positions of a 2-4 byte weight, so a per-step sum of 16 would cross threads).
"""

from __future__ import annotations

import triton
import triton.language as tl

from deepinfer_cuda_sm100.kernels._common import pdl_enter, scale_f32, store_tile, weight_base, weight_tile
from deepinfer_cuda_sm100.kernels.fp4_pairs import one_row_fp4_h2


@triton.jit
def e2m1_halves(b):
    """Packed e2m1 bytes (any integer type) -> (low, high) nibble values in float32, times ``2**-14``
    (placed in float16 bits)."""
    b = b.to(tl.uint16)
    lo = ((b & 0x8) << 12) | ((b & 0x7) << 9)
    hi = ((b & 0x80) << 8) | ((b & 0x70) << 5)
    return (
        lo.to(tl.float16, bitcast=True).to(tl.float32),
        hi.to(tl.float16, bitcast=True).to(tl.float32),
    )


#: e2m1 nibble -> bfloat16 half-word by bit placement: exponent+mantissa (3 bits) to bits 8..6 and the sign
#: to bit 15 give the code's value times 2**-126 (bfloat16's subnormals 0 and 2**-127 are e2m1's 0 and
#: 0.5), which one ``mul.bf16x2`` by ``scale * 2**126`` turns into the weight. With a byte in the low byte
#: of each half-word, a nibble is isolated (mask) and copied to both places at once by one multiply (the
#: two shifted copies do not overlap, so the sum is their union), then masked to sign+exponent+mantissa:
#: ``{half: (nibble mask, multiplier)}`` (low nibble: shifts 6 and 12; high nibble: 2 and 8).
E2M1_BF16_SPREAD = {"lo": (0x000F000F, (1 << 6) + (1 << 12)), "hi": (0x00F000F0, (1 << 2) + (1 << 8))}
E2M1_BF16_MASK = 0x81C081C0
#: ``prmt`` selectors putting bytes (0, 1) and (2, 3) of a register into the low bytes of its half-words
E2M1_BF16_PRMT = (0x4140, 0x4342)


def _e2m1_bf16_ptx() -> str:
    lines = ["{", ".reg .b32 y, t;"]
    for pair, sel in enumerate(E2M1_BF16_PRMT):  # bytes (0,1) then (2,3): output registers $pair and $2+pair
        lines.append(f"prmt.b32 y, $4, 0, {sel:#x};")
        for out, half in ((pair, "lo"), (2 + pair, "hi")):
            mask, mul = E2M1_BF16_SPREAD[half]
            lines += [f"and.b32 t, y, {mask:#x};", f"mul.lo.u32 t, t, {mul:#x};",
                      f"and.b32 t, t, {E2M1_BF16_MASK:#x};", f"mul.rn.bf16x2 ${out}, t, ${5 + pair};"]  # fmt: skip
    return "\n".join(lines + ["}"])


E2M1_BF16_PTX = tl.constexpr(_e2m1_bf16_ptx())


@triton.jit
def e2m1_bf16_scaled(b, s):
    """Packed e2m1 bytes ``b`` (uint8) and ``s = scale * 2**126`` (bfloat16, same shape) -> the (low, high)
    nibbles' weights in bfloat16: PTX on packed registers, four bytes per call (``sm_90``+, not under the
    interpreter; the bit logic is emulated in the tests from the same constants)."""
    return tl.inline_asm_elementwise(
        E2M1_BF16_PTX, "=r,=r,=r,=r,r,r,r", [b, s], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
    )


@triton.jit
def e8m0_bf16_unit(e):
    """ue8m0 scale bytes ``E <= 128`` -> ``2**(E-127) * 2**126`` in bfloat16 (the ``s`` of
    :func:`e2m1_bf16_scaled`)."""
    return ((e.to(tl.uint16) + 126) << 7).to(tl.bfloat16, bitcast=True)


@triton.jit
def fp4_scale(s):
    """:func:`scale_f32` times ``2**14``, the factor :func:`e2m1_halves` leaves out."""
    return scale_f32(s) * 16384.0


@triton.jit
def _fp4_tile(base, s_base, n, nm, k0, K, stride_wn, stride_sn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              ALIGNED: tl.constexpr, FP4_ASM: tl.constexpr):  # fmt: skip
    """``[BLOCK_N, BLOCK_K/32, 16]`` low and high halves of the bytes at K ``[k0, k0+BLOCK_K)`` in float32,
    and the ``[BLOCK_N, BLOCK_K/32]`` factors still to apply per scale group: the scales times ``2**14``
    (bit placement in Triton), or 1 (``FP4_ASM``: :func:`e2m1_bf16_scaled` has applied them)."""
    g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    byte = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    b = tl.reshape(weight_tile(base, n, stride_wn, byte, nm, K // 2, ALIGNED), (BLOCK_N, BLOCK_K // 32, 16))
    sc = tl.load(s_base + n[:, None] * stride_sn + g[None, :], mask=nm[:, None] & (g < tl.cdiv(K, 32))[None, :],
                 other=0)  # fmt: skip
    if FP4_ASM:
        s = tl.broadcast_to(e8m0_bf16_unit(sc)[:, :, None], (BLOCK_N, BLOCK_K // 32, 16))
        lo, hi = e2m1_bf16_scaled(b, s)
        return lo.to(tl.float32), hi.to(tl.float32), tl.full((BLOCK_N, BLOCK_K // 32), 1.0, tl.float32)
    lo, hi = e2m1_halves(b)
    return lo, hi, fp4_scale(sc)


@triton.jit
def _fp4_dot(lo, hi, sc, xe, xo):
    return tl.sum(tl.sum(lo * xe[None, :, :] + hi * xo[None, :, :], axis=2) * sc, axis=1)


@triton.jit
def _tile(base, n, nm, k0, K, stride_wn, BLOCK_K: tl.constexpr, FMT: tl.constexpr, ALIGNED: tl.constexpr):
    ks = k0 + tl.arange(0, BLOCK_K)
    if FMT == 1:
        return weight_tile(base, n, stride_wn, ks, nm, K, ALIGNED).to(tl.float32)
    w = tl.load(base + n[:, None] * stride_wn + ks[None, :], mask=nm[:, None] & (ks < K)[None, :], other=0.0)
    return w.to(tl.float32)


@triton.jit
def _k_scale(s_base, n0, k0, K, stride_sn, stride_sk, BLOCK_K: tl.constexpr, ALIGNED: tl.constexpr = False,
             SB: tl.constexpr = 128):  # fmt: skip
    """FP8 block scales along K for the ``SB``-row block holding ``n0``."""
    ks = k0 + tl.arange(0, BLOCK_K)
    if ALIGNED:
        return tl.load(s_base + (n0 // SB) * stride_sn + (ks // SB) * stride_sk)
    else:
        return tl.load(s_base + (n0 // SB) * stride_sn + (ks // SB) * stride_sk, mask=ks < K, other=0.0)


@triton.jit
def _row_tile(base, n, nm, k0, K, stride_wn, BLOCK_K: tl.constexpr, FMT: tl.constexpr, ALIGNED: tl.constexpr,
              EVEN_N: tl.constexpr):  # fmt: skip
    """:func:`_tile`, without any mask when the tile lies inside the matrix (``ALIGNED`` and ``EVEN_N``)."""
    if FMT <= 1 and ALIGNED and EVEN_N:
        ks = k0 + tl.arange(0, BLOCK_K)
        ptr = base + n[:, None] * stride_wn + ks[None, :]
        return tl.load(tl.max_contiguous(tl.multiple_of(ptr, [16, 16]), [1, 16])).to(tl.float32)
    else:
        return _tile(base, n, nm, k0, K, stride_wn, BLOCK_K, FMT, ALIGNED)


@triton.jit
def _few_rows(a_ptr, a_idx_ptr, r0, r1, stride_am, w_base, s_base, up_base, up_s_base, n, nm, n0, k_lo, k_hi, K,
              stride_wn, stride_sn, stride_sk, FMT: tl.constexpr, GATED: tl.constexpr, HAS_A_IDX: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALIGNED: tl.constexpr,
              FP4_ASM: tl.constexpr, SB: tl.constexpr):  # fmt: skip
    """Tiles of 2-8 rows: each weight tile is reduced against every row of the tile in turn."""
    mi = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if FMT == 2:
            w_lo, w_hi, w_s = _fp4_tile(
                w_base, s_base, n, nm, k0, K, stride_wn, stride_sn, BLOCK_N, BLOCK_K, ALIGNED, FP4_ASM
            )
            if GATED:
                u_lo, u_hi, u_s = _fp4_tile(
                    up_base, up_s_base, n, nm, k0, K, stride_wn, stride_sn, BLOCK_N, BLOCK_K, ALIGNED, FP4_ASM
                )
            # [BLOCK_K/32, 16] even K positions, laid out as the bytes
            ke = k0 + tl.arange(0, BLOCK_K // 32)[:, None] * 32 + 2 * tl.arange(0, 16)[None, :]
        else:
            w_t = _tile(w_base, n, nm, k0, K, stride_wn, BLOCK_K, FMT, ALIGNED)
            if GATED:
                u_t = _tile(up_base, n, nm, k0, K, stride_wn, BLOCK_K, FMT, ALIGNED)
            ks = k0 + tl.arange(0, BLOCK_K)
            if FMT == 1:
                w_ks = _k_scale(s_base, n0, k0, K, stride_sn, stride_sk, BLOCK_K, False, SB)
                if GATED:
                    u_ks = _k_scale(up_s_base, n0, k0, K, stride_sn, stride_sk, BLOCK_K, False, SB)
        for m in tl.static_range(BLOCK_M):
            # Rows past the tile's end repeat its last row (a used tile has one): their sums are never stored.
            r = tl.minimum(r0 + m, r1 - 1)
            if HAS_A_IDX:
                a_row = tl.load(a_idx_ptr + r)
            else:
                a_row = r
            x_base = a_ptr + a_row.to(tl.int64) * stride_am
            if FMT == 2:
                xe = tl.load(x_base + ke, mask=ke < K, other=0.0).to(tl.float32)
                xo = tl.load(x_base + ke + 1, mask=ke + 1 < K, other=0.0).to(tl.float32)
                p = _fp4_dot(w_lo, w_hi, w_s, xe, xo)
                if GATED:
                    p2 = _fp4_dot(u_lo, u_hi, u_s, xe, xo)
            else:
                x = tl.load(x_base + ks, mask=ks < K, other=0.0).to(tl.float32)
                if FMT == 1:
                    p = tl.sum(w_t * (x * w_ks)[None, :], axis=1)
                    if GATED:
                        p2 = tl.sum(u_t * (x * u_ks)[None, :], axis=1)
                else:
                    p = tl.sum(w_t * x[None, :], axis=1)
                    if GATED:
                        p2 = tl.sum(u_t * x[None, :], axis=1)
            acc = tl.where(mi[:, None] == m, acc + p[None, :], acc)
            if GATED:
                acc2 = tl.where(mi[:, None] == m, acc2 + p2[None, :], acc2)
    return acc, acc2


@triton.jit
def _fp4_partial(lo, hi, sc, xe, xo, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP4_ASM: tl.constexpr):
    """``[BLOCK_N, BLOCK_K / 16]`` partial dot products of one FP4 step: each thread's 16 codes of a row summed
    in registers (the low and high nibbles as two multiply-add chains), scaled per group unless the PTX decode
    already applied the scales."""
    shape: tl.constexpr = [BLOCK_N, BLOCK_K // 32, 2, 8]
    p = tl.sum(tl.reshape(lo * xe, shape), axis=3) + tl.sum(tl.reshape(hi * xo, shape), axis=3)
    if not FP4_ASM:
        p = p * sc[:, :, None]
    return tl.reshape(p, [BLOCK_N, BLOCK_K // 16])


@triton.jit
def _one_row(a_ptr, a_idx_ptr, r0, stride_am, w_base, s_base, up_base, up_s_base, n, nm, n0, k_lo, k_hi, K,
             stride_wn, stride_sn, stride_sk, FMT: tl.constexpr, GATED: tl.constexpr, HAS_A_IDX: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALIGNED: tl.constexpr, FP4_ASM: tl.constexpr,
             EVEN_N: tl.constexpr, SB: tl.constexpr):  # fmt: skip
    """One row per tile (decode): each thread sums the products of its 16 consecutive K positions in registers
    into a ``[BLOCK_N, BLOCK_K / 16]`` partial, and the partials are reduced across threads once, after the K
    loop, not once per K step (that reduction's shuffles and barriers were a fifth of the FP8 loop). The
    partial stays as small as the old per-step sum, so registers (and occupancy) do not grow (NOTES.md v9)."""
    if HAS_A_IDX:
        a_row = tl.load(a_idx_ptr + r0)
    else:
        a_row = r0
    x_base = a_ptr + a_row.to(tl.int64) * stride_am
    acc_t = tl.zeros([BLOCK_N, BLOCK_K // 16], dtype=tl.float32)
    acc2_t = tl.zeros_like(acc_t)
    acc_w = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2_w = tl.zeros_like(acc_w)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if FMT == 2:
            if ALIGNED:  # whole steps: the even and odd K positions from one contiguous load
                kx = k0 + tl.arange(0, BLOCK_K)
                xe, xo = tl.split(tl.reshape(tl.load(x_base + kx).to(tl.float32), (BLOCK_K // 32, 16, 2)))
                xe, xo = xe[None, :, :], xo[None, :, :]
            else:
                ke = k0 + tl.arange(0, BLOCK_K // 32)[:, None] * 32 + 2 * tl.arange(0, 16)[None, :]
                xe = tl.load(x_base + ke, mask=ke < K, other=0.0).to(tl.float32)[None, :, :]
                xo = tl.load(x_base + ke + 1, mask=ke + 1 < K, other=0.0).to(tl.float32)[None, :, :]
            w_lo, w_hi, w_s = _fp4_tile(
                w_base, s_base, n, nm, k0, K, stride_wn, stride_sn, BLOCK_N, BLOCK_K, ALIGNED, FP4_ASM
            )
            acc_t += _fp4_partial(w_lo, w_hi, w_s, xe, xo, BLOCK_N, BLOCK_K, FP4_ASM)
            if GATED:
                u_lo, u_hi, u_s = _fp4_tile(
                    up_base, up_s_base, n, nm, k0, K, stride_wn, stride_sn, BLOCK_N, BLOCK_K, ALIGNED, FP4_ASM
                )
                acc2_t += _fp4_partial(u_lo, u_hi, u_s, xe, xo, BLOCK_N, BLOCK_K, FP4_ASM)
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            if ALIGNED:  # K is whole steps: no mask (and no predicated loads) along K
                x = tl.load(x_base + ks).to(tl.float32)
            else:
                x = tl.load(x_base + ks, mask=ks < K, other=0.0).to(tl.float32)
            xw = x
            if FMT == 1:
                xw = x * _k_scale(s_base, n0, k0, K, stride_sn, stride_sk, BLOCK_K, ALIGNED, SB)
            p = _row_tile(w_base, n, nm, k0, K, stride_wn, BLOCK_K, FMT, ALIGNED, EVEN_N) * xw[None, :]
            if FMT == 0:  # 2-4 byte weights: a thread's 16-byte load holds 4-8 K positions, not 16
                acc_w += p
            else:
                acc_t += tl.sum(tl.reshape(p, [BLOCK_N, BLOCK_K // 16, 16]), axis=2)
            if GATED:
                xu = x
                if FMT == 1:
                    xu = x * _k_scale(up_s_base, n0, k0, K, stride_sn, stride_sk, BLOCK_K, ALIGNED, SB)
                p2 = _row_tile(up_base, n, nm, k0, K, stride_wn, BLOCK_K, FMT, ALIGNED, EVEN_N) * xu[None, :]
                if FMT == 0:
                    acc2_w += p2
                else:
                    acc2_t += tl.sum(tl.reshape(p2, [BLOCK_N, BLOCK_K // 16, 16]), axis=2)
    if FMT == 0:  # plain weights: whole-tile accumulators (FMAs only in the loop), reduced once
        return tl.sum(acc_w, axis=1)[None, :], tl.sum(acc2_w, axis=1)[None, :]
    acc = tl.sum(acc_t, axis=1)[None, :]
    acc2 = tl.sum(acc2_t, axis=1)[None, :]
    return acc, acc2


@triton.jit
def _grouped_gemv_kernel(
    a_ptr, a_idx_ptr, c_ptr, c_idx_ptr, row_w_ptr, add_ptr,
    w_tab, s_tab, up_tab, up_s_tab,
    tile_expert_ptr, tile_start_ptr, tile_end_ptr,
    N, K, stride_am, stride_cm, stride_wn, stride_sn, stride_sk, limit,
    ws_ptr, cnt_ptr, R, k_per_split,
    FMT: tl.constexpr, W_T: tl.constexpr, S_T: tl.constexpr,
    GATED: tl.constexpr, HAS_A_IDX: tl.constexpr, HAS_C_IDX: tl.constexpr, HAS_ROW_W: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ALIGNED: tl.constexpr, FP4_ASM: tl.constexpr, EVEN_N: tl.constexpr = False, FP4_H2: tl.constexpr = 0,
    FINISH: tl.constexpr = False, SB: tl.constexpr = 128, HAS_ADD: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """``SB``: the FP8 scale block (rows and columns; ``BLOCK_N`` divides it). ``EVEN_N``: ``N`` is whole ``BLOCK_N`` blocks (with ``ALIGNED``, one-row FP8 tiles load without masks).
    ``FP4_H2``: one-row FP4 tiles (``ALIGNED``, bf16 or float16 activations) in float16 pair arithmetic
    (:func:`fp4_pairs.one_row_fp4_h2`): 2 by PTX, 1 emulated in Triton (the interpreter), 0 not."""
    pdl_enter(PDL)
    tile = tl.program_id(0)
    ex = tl.load(tile_expert_ptr + tile)
    if ex < 0:
        return
    r0 = tl.load(tile_start_ptr + tile)
    r1 = tl.load(tile_end_ptr + tile)
    n0 = tl.program_id(1) * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    nm = n < N
    mi = tl.arange(0, BLOCK_M)
    w_base = weight_base(w_tab, ex, W_T, ALIGNED)
    s_base = tl.load(s_tab + ex).to(tl.pointer_type(S_T))
    up_base = weight_base(up_tab, ex, W_T, ALIGNED)
    up_s_base = tl.load(up_s_tab + ex).to(tl.pointer_type(S_T))
    k_lo = tl.program_id(2) * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    if FMT == 2 and BLOCK_M == 1 and FP4_H2 > 0:
        if HAS_A_IDX:
            a_row = tl.load(a_idx_ptr + r0)
        else:
            a_row = r0
        acc, acc2 = one_row_fp4_h2(a_ptr + a_row.to(tl.int64) * stride_am, w_base, s_base, up_base, up_s_base, n,
                                    nm, k_lo, k_hi, stride_wn, stride_sn, GATED, BLOCK_N, BLOCK_K, FP4_H2 == 2)  # fmt: skip
    elif BLOCK_M == 1:
        acc, acc2 = _one_row(a_ptr, a_idx_ptr, r0, stride_am, w_base, s_base, up_base, up_s_base, n, nm, n0, k_lo,
                             k_hi, K, stride_wn, stride_sn, stride_sk, FMT, GATED, HAS_A_IDX, BLOCK_N, BLOCK_K,
                             ALIGNED, FP4_ASM, EVEN_N, SB)  # fmt: skip
    else:
        acc, acc2 = _few_rows(a_ptr, a_idx_ptr, r0, r1, stride_am, w_base, s_base, up_base, up_s_base, n, nm, n0,
                              k_lo, k_hi, K, stride_wn, stride_sn, stride_sk, FMT, GATED, HAS_A_IDX, BLOCK_M,
                              BLOCK_N, BLOCK_K, ALIGNED, FP4_ASM, SB)  # fmt: skip
    rows = r0 + mi
    store_tile(acc, acc2, rows, rows < r1, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, ws_ptr, cnt_ptr, R, N,
               stride_cm, limit, GATED, HAS_C_IDX, HAS_ROW_W, SPLIT_K, FINISH, HAS_ADD)  # fmt: skip
