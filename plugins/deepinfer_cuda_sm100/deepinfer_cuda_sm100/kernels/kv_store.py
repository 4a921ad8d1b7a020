"""KV store: rows into a KV pool at slot ids, one launch: cast into a plain pool (:func:`store_plain`), or packed
into an FP8 pool byte for byte as ``Fp8KVFormat.pack`` (:func:`store_fp8`).

Plain: one program per row copies it, cast to the pool's dtype (torch's ``pool[slots] = values`` is an
index-put kernel plus, for another dtype, a cast kernel; this one also joins the decode step's chain of
dependent launches, ``dispatch.pdl_args``).

FP8:
one program per row. The ``nope`` channels are a ``[groups, 64]`` tile; each group's scale is the power of
two built from the exponent and mantissa bits of its amax (see ``power_of_two_scale``), and the codes are
``x * (1 / scale)``, both factors exact, rounded to the e4m3 grid (nearest, ties to even) in float32. The
RoPE channels are stored in the model dtype. Padding bytes are never written (pools start zeroed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.plugin_api import E4M3_MAX, Fp8KVFormat
from deepinfer_core.plugin_api import FP8_KV_GROUP as GROUP
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pool_slot, pow2

_MIN_AMAX = tl.constexpr(7.888609052210118e-31)  # 2**-100, as in deepinfer_core.ops.kv_fp8
_MAX = tl.constexpr(E4M3_MAX)


@triton.jit
def _e4m3_grid(y):
    """``y`` (``|y| <= 448``) rounded to the nearest e4m3 value, ties to even, still in float32, so the cast
    after it is exact. Triton's interpreter rounds float32 -> e4m3 without carrying a mantissa overflow
    into the exponent (1.97 becomes 1.0), and an exact cast is the same on every implementation.
    Normal range: keep 3 mantissa bits of the float32 pattern; below 2**-6: multiples of 2**-9."""
    b = y.to(tl.int32, bitcast=True)
    normal = ((b + 0x7FFFF + ((b >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # -1048576: 0xFFF00000
    t = tl.abs(y) * 512.0
    small = ((t + 8388608.0) - 8388608.0) * 0.001953125  # 2**23: float32 addition rounds t to an integer
    return tl.where(tl.abs(y) >= 0.015625, normal, tl.where(b < 0, -small, small))  # b < 0: keeps -0.0


@triton.jit
def _pack_kernel(x_ptr, slots_ptr, code_ptr, rope_ptr, scale_ptr, stride_x, NOPE, ROPE, ROW, ROPE_ROW, ROPE_OFF,
                 SCALE_ROW, SCALE_OFF, NG, S, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_R: tl.constexpr,
                 PDL: tl.constexpr = False):  # fmt: skip
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    slot = pool_slot(slots_ptr, r, S)
    g = tl.arange(0, BLOCK_G)
    ch = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    m = ch < NOPE
    x = tl.load(x_ptr + r * stride_x + ch, mask=m, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), _MIN_AMAX)
    bits = amax.to(tl.int32, bitcast=True)
    # amax = m * 2**k, m in [0.5, 1): k = biased exponent - 126; m > 0.875 iff the mantissa field > 0.75 * 2**23
    e = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    scale = ((e + 127) << 23).to(tl.float32, bitcast=True)
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    y = tl.minimum(tl.maximum(x * inv[:, None], -_MAX), _MAX)
    q = _e4m3_grid(y)
    code = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    # a negative value that rounds to zero is e4m3 -0 (0x80), as torch packs it; the H200's conversion
    # gave +0 (v8: 3 of 2M bytes differed from the torch pack, all of them this case)
    neg_zero = (q == 0.0) & (y.to(tl.int32, bitcast=True) < 0)
    code = tl.where(neg_zero, tl.full(code.shape, 0x80, tl.uint8), code)
    tl.store(code_ptr + slot * ROW + ch, code.to(tl.float8e4nv, bitcast=True), mask=m)
    tl.store(scale_ptr + slot * SCALE_ROW + SCALE_OFF + g, scale, mask=g < NG)
    j = tl.arange(0, BLOCK_R)
    rope = tl.load(x_ptr + r * stride_x + NOPE + j, mask=j < ROPE, other=0.0)
    tl.store(rope_ptr + slot * ROPE_ROW + ROPE_OFF + j, rope.to(rope_ptr.dtype.element_ty), mask=j < ROPE)


def store_fp8(pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, fmt: Fp8KVFormat) -> None:
    """``pool[slots] = fmt.pack(values)`` for a flat packed pool ``[S, row_bytes]`` uint8."""
    n = values.shape[0]
    if n == 0:
        return
    values, slots = values.contiguous(), slots.contiguous()
    rs = fmt.rope_dtype.itemsize
    _pack_kernel[(n,)](
        values, slots, pool.view(torch.float8_e4m3fn), pool.view(fmt.rope_dtype), pool.view(torch.float32),
        values.stride(0), fmt.nope, fmt.rope_dim, fmt.row_bytes, fmt.row_bytes // rs, fmt.rope_offset // rs,
        fmt.row_bytes // 4, fmt.scale_offset // 4, fmt.num_scales, pool.shape[0],
        GROUP=GROUP, BLOCK_G=pow2(fmt.num_scales, 1), BLOCK_R=pow2(max(fmt.rope_dim, 1), 16), num_warps=4,
        **dispatch.pdl_args(n),
    )  # fmt: skip


@triton.jit
def _store_kernel(x_ptr, slots_ptr, pool_ptr, D, S, stride_x, stride_p, BLOCK_D: tl.constexpr,
                  PDL: tl.constexpr = False):  # fmt: skip
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    slot = pool_slot(slots_ptr, r, S)
    d = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + r * stride_x + d, mask=d < D, other=0.0)
    tl.store(pool_ptr + slot * stride_p + d, x.to(pool_ptr.dtype.element_ty), mask=d < D)


def store_plain(pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """``pool[slots] = values.to(pool.dtype)`` for a pool ``[S, D]`` (rows contiguous) and ``values [N, D]``; as
    with torch, which of two rows sent to one slot lands is not defined (padding rows all go to the scratch
    slot)."""
    n = values.shape[0]
    if n == 0:
        return
    rows = pool
    values = values if values.stride(-1) == 1 else values.contiguous()
    D = rows.shape[1]
    _store_kernel[(n,)](
        values, slots.contiguous(), rows, D, rows.shape[0], values.stride(0), rows.stride(0),
        BLOCK_D=pow2(D, 16), num_warps=4 if D >= 512 else 1, **dispatch.pdl_args(n),
    )  # fmt: skip
