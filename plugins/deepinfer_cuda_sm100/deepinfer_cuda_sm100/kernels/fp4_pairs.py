"""One-row FP4 GEMV tiles in float16 pair arithmetic (decode experts with bf16 or float16 activations).

The float32 path of :mod:`~deepinfer_cuda_sm100.kernels.gemv` takes about six instructions a code: the PTX decode
into scaled bf16, a conversion to float32, an FMA, and the scales' packing. Here a code takes about four: it is
decoded by bit placement into float16 (the code times ``2**-14``, no scale multiply), multiplied with
``fma.rn.f16x2`` against float16 activation pairs eight codes to a 32-bit word, the word's two lane sums
converted to float32, added over the 32-code group and scaled per group in float32.

The activations are scaled by a power of two first so that they fit float16 (:func:`one_row_fp4_h2`). The PTX
(:data:`E2M1_F16_DOT_PTX`) cannot run under the interpreter, which runs the same steps in Triton
(:func:`_e2m1_f16_emulated`); the tests execute the PTX text itself on the CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deepinfer_cuda_sm100.kernels._common import scale_f32

#: e2m1 codes -> float16 by bit placement, two codes per instruction chain: ``prmt`` puts bytes (0, 1), or
#: (2, 3), of a weight word in the high bytes of a register's half-words (selectors below), where a high
#: nibble's sign already sits in bit 15; then per half-word the sign goes to bit 15 and exponent+mantissa
#: (3 bits) to bits 11..9, which is the code's value times ``2**-14`` (float16's subnormals 0 and 2**-15 are
#: e2m1's 0 and 0.5). ``{nibble: ((sign shift, exponent+mantissa shift)}``, left shifts positive.
E2M1_F16_PRMT = (0x1404, 0x3424)
E2M1_F16_SHIFT = {"lo": (4, 1), "hi": (0, -3)}
E2M1_F16_SIGN, E2M1_F16_EM = 0x80008000, 0x0E000E00


def _e2m1_f16_dot_ptx() -> str:
    """One weight word (8 codes, ``$1``) against its 8 activations as float16 pairs (``$2..$5``: K positions
    (0, 2), (1, 3), (4, 6), (5, 7)) -> ``$0``, the float32 sum of the two float16 lanes of four ``fma.f16x2``."""

    def shift(dst, src, n):
        return f"shl.b32 {dst}, {src}, {n};" if n > 0 else f"shr.b32 {dst}, {src}, {-n};" if n < 0 else ""

    lines = ["{", ".reg .b32 y, a, b, c, acc;", ".reg .b16 h0, h1;", ".reg .f32 f0, f1;"]
    reg = 2
    for sel in E2M1_F16_PRMT:
        lines.append(f"prmt.b32 y, $1, 0, {sel:#x};")
        for half in ("lo", "hi"):
            s, e = E2M1_F16_SHIFT[half]
            lines += [shift("a", "y", s) or "mov.b32 a, y;", f"and.b32 a, a, {E2M1_F16_SIGN:#x};",
                      shift("b", "y", e), f"and.b32 b, b, {E2M1_F16_EM:#x};", "or.b32 c, a, b;",
                      f"mul.rn.f16x2 acc, c, ${reg};" if reg == 2 else f"fma.rn.f16x2 acc, c, ${reg}, acc;"]  # fmt: skip
            reg += 1
    lines += ["mov.b32 {h0, h1}, acc;", "cvt.f32.f16 f0, h0;", "cvt.f32.f16 f1, h1;", "add.f32 f0, f0, f1;",
              "mov.b32 $0, f0;", "}"]  # fmt: skip
    return "\n".join(x for x in lines if x)


E2M1_F16_DOT_PTX = tl.constexpr(_e2m1_f16_dot_ptx())


_F16_SIGN = tl.constexpr(E2M1_F16_SIGN)
_F16_EM = tl.constexpr(E2M1_F16_EM)


@triton.jit
def _f16_pair(c):
    """A uint32 of two float16 bit patterns -> the two float16 values (low half first)."""
    return (c & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True), (c >> 16).to(tl.uint16).to(
        tl.float16, bitcast=True
    )


@triton.jit
def _e2m1_f16_emulated(w, x0, x1, x2, x3):
    """:data:`E2M1_F16_DOT_PTX` step by step in Triton (the interpreter), from the same constants; float16
    multiply then add where the PTX fuses them."""
    y01 = ((w & 0xFF) << 8) | (((w >> 8) & 0xFF) << 24)  # prmt E2M1_F16_PRMT[0]
    y23 = (((w >> 16) & 0xFF) << 8) | ((w >> 24) << 24)  # prmt E2M1_F16_PRMT[1]
    lo01 = ((y01 << 4) & _F16_SIGN) | ((y01 << 1) & _F16_EM)  # E2M1_F16_SHIFT["lo"]
    hi01 = (y01 & _F16_SIGN) | ((y01 >> 3) & _F16_EM)  # E2M1_F16_SHIFT["hi"]
    lo23 = ((y23 << 4) & _F16_SIGN) | ((y23 << 1) & _F16_EM)
    hi23 = (y23 & _F16_SIGN) | ((y23 >> 3) & _F16_EM)
    c0, c1 = _f16_pair(lo01)
    a0, a1 = _f16_pair(x0)
    acc0, acc1 = c0 * a0, c1 * a1
    c0, c1 = _f16_pair(hi01)
    a0, a1 = _f16_pair(x1)
    acc0, acc1 = acc0 + c0 * a0, acc1 + c1 * a1
    c0, c1 = _f16_pair(lo23)
    a0, a1 = _f16_pair(x2)
    acc0, acc1 = acc0 + c0 * a0, acc1 + c1 * a1
    c0, c1 = _f16_pair(hi23)
    a0, a1 = _f16_pair(x3)
    acc0, acc1 = acc0 + c0 * a0, acc1 + c1 * a1
    return acc0.to(tl.float32) + acc1.to(tl.float32)


@triton.jit
def e2m1_f16_word_dot(w, x0, x1, x2, x3, PTX: tl.constexpr):
    """Weight words ``w`` (uint32, 8 e2m1 codes each, low nibble first) against float16 activation pairs
    ``x0..x3`` (uint32 bit patterns of K positions (0, 2), (1, 3), (4, 6), (5, 7) of the word) -> float32
    sums of the 8 products times ``2**-14``, in float16 arithmetic (:data:`E2M1_F16_DOT_PTX` with ``PTX``,
    else :func:`_e2m1_f16_emulated`)."""
    if PTX:
        return tl.inline_asm_elementwise(
            E2M1_F16_DOT_PTX, "=r,r,r,r,r,r", [w, x0, x1, x2, x3], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return _e2m1_f16_emulated(w, x0, x1, x2, x3)


@triton.jit
def _fp4_words(base, s_base, rows, k0, stride_wn, stride_sn, BLOCK_K: tl.constexpr):
    """``[BLOCK_N, BLOCK_K / 8]`` uint32 words (8 codes each) of rows ``rows`` (all inside the matrix) at K
    ``[k0, k0 + BLOCK_K)`` (inside it too) and their ``[BLOCK_N, BLOCK_K / 32]`` scales (float32); rows 16-byte
    aligned (``ALIGNED``) and no masks, so each thread loads 16 bytes at once."""
    row = (base + rows[:, None] * stride_wn + k0 // 2).to(tl.pointer_type(tl.uint32))
    ptr = tl.max_contiguous(tl.multiple_of(row + tl.arange(0, BLOCK_K // 8)[None, :], [16, 16]), [1, 4])
    g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    return tl.load(ptr), scale_f32(tl.load(s_base + rows[:, None] * stride_sn + g[None, :]))


@triton.jit
def _f16_word_pairs(x, BLOCK_K: tl.constexpr):
    """``[BLOCK_K]`` float16 activations -> the four ``[1, BLOCK_K / 8]`` uint32 pairs :func:`e2m1_f16_word_dot`
    takes per word (K positions (0, 2), (1, 3), (4, 6), (5, 7) of each word)."""
    xb = tl.reshape(x.to(tl.uint16, bitcast=True).to(tl.uint32), (BLOCK_K // 8, 2, 2, 2))  # word, p, j, h
    lo, hi = tl.split(xb)  # nibble h: [W, p, j]
    a, b = tl.split(lo)  # byte j of the pair
    x0, x2 = tl.split(a | (b << 16))  # pair p
    a, b = tl.split(hi)
    x1, x3 = tl.split(a | (b << 16))
    return x0[None, :], x1[None, :], x2[None, :], x3[None, :]


@triton.jit
def _fp4_h2_dot(w, sc, x0, x1, x2, x3, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PTX: tl.constexpr):
    """One K step of one weight (:func:`_fp4_words`): ``[BLOCK_N, BLOCK_K / 32]`` scaled group sums (times
    ``2**-14``)."""
    shape: tl.constexpr = (BLOCK_N, BLOCK_K // 8)
    p = e2m1_f16_word_dot(w, tl.broadcast_to(x0, shape), tl.broadcast_to(x1, shape), tl.broadcast_to(x2, shape),
                          tl.broadcast_to(x3, shape), PTX)  # fmt: skip
    return tl.sum(tl.reshape(p, (BLOCK_N, BLOCK_K // 32, 4)), axis=2) * sc


@triton.jit
def one_row_fp4_h2(x_base, w_base, s_base, up_base, up_s_base, n, nm, k_lo, k_hi, stride_wn, stride_sn,
                    GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PTX: tl.constexpr):  # fmt: skip
    """One FP4 row in float16 pair arithmetic (two thirds of the instructions a code of :func:`_one_row`'s
    float32 path takes): codes decoded to float16 (times ``2**-14``) and multiplied with ``fma.f16x2`` eight to
    a word, the word sums added in float32 and scaled per 32-code group.

    The activations are first scaled by a power of two, ``2**(14 - e)`` with ``2**e`` the largest magnitude
    of this program's K range (exact), so every one fits float16 (below ``2**15``) and every product of a code
    (at most ``6 * 2**-14``) stays below 12; the sums are multiplied back by ``2**e`` at the end. A product
    carries float16's 11 significant bits, the four-product lane sums round to float16: the error is of
    the order of the bf16 result's own rounding (the float32 path serves float32 activations).

    The next step's weights, scales and activations are loaded before this step's arithmetic (registers,
    double-buffered), so their latency overlaps it rather than following it."""
    kx = tl.arange(0, BLOCK_K)
    rows = tl.where(nm, n, 0)  # rows past N read row 0 (never stored): no masks
    w_n, ws_n = _fp4_words(
        w_base, s_base, rows, k_lo, stride_wn, stride_sn, BLOCK_K
    )  # in flight during the max
    u_n, us_n = w_n, ws_n
    if GATED:
        u_n, us_n = _fp4_words(up_base, up_s_base, rows, k_lo, stride_wn, stride_sn, BLOCK_K)
    x_n = tl.load(x_base + k_lo + kx)
    amax = tl.abs(x_n.to(tl.float32))
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        amax = tl.maximum(amax, tl.abs(tl.load(x_base + k0 + kx).to(tl.float32)))
    e = tl.maximum(((tl.max(amax, axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -100)
    pre = ((141 - e) << 23).to(tl.float32, bitcast=True)  # 2**(14 - e)
    acc_t = tl.zeros([BLOCK_N, BLOCK_K // 32], dtype=tl.float32)
    acc2_t = tl.zeros_like(acc_t)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        w, ws, u, us, x = w_n, ws_n, u_n, us_n, x_n
        kn = tl.minimum(k0 + BLOCK_K, k_hi - BLOCK_K)  # after the last step: the last step again
        w_n, ws_n = _fp4_words(w_base, s_base, rows, kn, stride_wn, stride_sn, BLOCK_K)
        if GATED:
            u_n, us_n = _fp4_words(up_base, up_s_base, rows, kn, stride_wn, stride_sn, BLOCK_K)
        x_n = tl.load(x_base + kn + kx)
        x0, x1, x2, x3 = _f16_word_pairs((x.to(tl.float32) * pre).to(tl.float16), BLOCK_K)
        acc_t += _fp4_h2_dot(w, ws, x0, x1, x2, x3, BLOCK_N, BLOCK_K, PTX)
        if GATED:
            acc2_t += _fp4_h2_dot(u, us, x0, x1, x2, x3, BLOCK_N, BLOCK_K, PTX)
    post = ((127 + e) << 23).to(tl.float32, bitcast=True)  # 2**e
    return (tl.sum(acc_t, axis=1) * post)[None, :], (tl.sum(acc2_t, axis=1) * post)[None, :]
