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
from deepinfer_cuda_sm100.kernels._common import e2m1_value, e4m3_grid, pdl_enter, pool_slot, pow2, pow2_ceil
from deepinfer_cuda_sm100.kernels.norm_rope import rope_row
from deepinfer_cuda_sm100.kernels.sparse_attention import packed_layout

_MIN_AMAX = tl.constexpr(7.888609052210118e-31)  # 2**-100, as in deepinfer_core.ops.kv_fp8
_MAX = tl.constexpr(E4M3_MAX)


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
    q = e4m3_grid(y)
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


# ----------------------------------------------------------------------------------------- V4.1 packed entries


@triton.jit
def _e2m1_code(v):
    """float32 ``v`` in ``[-6, 6]`` -> 4-bit codes (``kv_quant.e2m1_codes``: the count of midpoints below
    ``|v|``, a tie on a midpoint taking the even code; bit 3 the sign bit of ``v``, so -0.0 is code 8). The tie
    rule is folded into the comparisons: a midpoint whose upper code is even counts when ``|v|`` reaches it
    (``>=``), one whose upper code is odd only past it (``>``). Seven compares and no table (a third of the
    operations of a midpoint loop with a tie mask: under CI's interpreter each is a numpy call a program)."""
    mag = tl.abs(v)
    code = (
        (mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
        + (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
        + (mag > 5.0).to(tl.int32)
    )  # fmt: skip
    return code | ((v.to(tl.int32, bitcast=True) < 0).to(tl.int32) << 3)


@triton.jit
def _v41_scaled(x, PACK: tl.constexpr):
    """Blocks ``x [NB, B]`` (float32) divided by their scale as ``PackedKV.pack`` divides them: ``(y, s, scale
    byte)`` with ``y`` clamped to the code grid's range (e4m3 for ``PACK`` 1, e2m1 otherwise) and not yet rounded
    to it, ``s [NB]`` the float32 scales."""
    amax = tl.max(tl.abs(x), axis=1)
    if PACK == 1:  # e4m3 codes, ue8m0 scale: kv_quant.quantize_fp8
        s, e = pow2_ceil(tl.maximum(amax, 1e-4) * (1.0 / 448.0))
        inv = ((254 - e) << 23).to(tl.float32, bitcast=True)  # 1 / s, exact
        y = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
        sbyte = e.to(tl.uint8)
    else:  # e2m1 codes: kv_quant.quantize_fp4 with e4m3 (PACK 2) or ue8m0 (PACK 3) scales
        if PACK == 2:
            s = e4m3_grid(tl.minimum(tl.maximum(amax, 6.0 * 0.001953125) * (1.0 / 6.0), 448.0))
            sbyte = s.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        else:
            s, e = pow2_ceil(tl.maximum(amax, 6.0 * 1.1754943508222875e-38) * (1.0 / 6.0))
            sbyte = e.to(tl.uint8)
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, s[:, None]), -6.0), 6.0)
    return y, s, sbyte


@triton.jit
def _pack_v41_row(x, slot, pool_ptr, ROW: tl.constexpr, D: tl.constexpr, B: tl.constexpr, PACK: tl.constexpr):
    """One row ``x [D // B, B]`` (float32) packed as ``PackedKV.pack`` packs it into byte row ``slot``: ``D`` codes
    (bytes, or nibbles two a byte), then ``D / B`` scale bytes."""
    NB: tl.constexpr = D // B
    g = tl.arange(0, NB)
    y, s, sbyte = _v41_scaled(x, PACK)
    row = pool_ptr + slot * ROW
    if PACK == 1:
        q = e4m3_grid(y)
        code = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        neg_zero = (q == 0.0) & (y.to(tl.int32, bitcast=True) < 0)
        code = tl.where(neg_zero, tl.full(code.shape, 0x80, tl.uint8), code)
        tl.store(row + g[:, None] * B + tl.arange(0, B)[None, :], code)
        tl.store(row + D + g, sbyte)
    else:
        c = tl.reshape(_e2m1_code(y), (D // 2, 2))
        lo, hi = tl.split(c)
        tl.store(row + tl.arange(0, D // 2), (lo | (hi << 4)).to(tl.uint8))
        tl.store(row + D // 2 + g, sbyte)


@triton.jit
def _pack_v41_kernel(x_ptr, slots_ptr, pool_ptr, stride_x, S, ROW: tl.constexpr, D: tl.constexpr,
                     B: tl.constexpr, PACK: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Row ``program_id(0)`` of ``x [N, D]`` packed into byte row ``slots[r]`` (:func:`_pack_v41_row`)."""
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    slot = pool_slot(slots_ptr, r, S)
    NB: tl.constexpr = D // B
    g = tl.arange(0, NB)
    x = tl.load(x_ptr + r * stride_x + g[:, None] * B + tl.arange(0, B)[None, :]).to(tl.float32)
    _pack_v41_row(x, slot, pool_ptr, ROW, D, B, PACK)


@triton.jit
def _norm_rope_pack_v41_kernel(x_ptr, w_ptr, pos_ptr, freq_ptr, slots_ptr, pool_ptr, stride_x, S, R2, eps,
                               ROW: tl.constexpr, D: tl.constexpr, B: tl.constexpr, PACK: tl.constexpr,
                               HAS_W: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Row ``program_id(0)`` of ``x [N, D]`` normed (``w``, ``eps``) and rotated at ``pos[r]`` as
    ``_rms_norm_rope_kernel`` does it (each rounded to ``x``'s dtype), then packed into byte row ``slots[r]``
    (``compose_rms_norm_rope_store_kv``)."""
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    slot = pool_slot(slots_ptr, r, S)
    d = tl.arange(0, D)
    x = tl.load(x_ptr + r * stride_x + d).to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps))
    if HAS_W:
        y = y * tl.load(w_ptr + d).to(tl.float32)
    ty = x_ptr.dtype.element_ty
    y = y.to(ty).to(tl.float32)
    y = rope_row(y, tl.load(pos_ptr + r).to(tl.float32), freq_ptr, D, R2, D)
    y = y.to(ty).to(tl.float32)
    _pack_v41_row(tl.reshape(y, (D // B, B)), slot, pool_ptr, ROW, D, B, PACK)


@triton.jit
def _roundtrip_v41_kernel(x_ptr, out_ptr, stride_x, stride_o, D: tl.constexpr, B: tl.constexpr,
                          PACK: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Row ``program_id(0)`` of ``x [N, D]`` as the pool returns it after a store (``PackedKV.roundtrip``): the
    codes and scales of :func:`_pack_v41_kernel`, decoded in registers (every value exact in bf16)."""
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    NB: tl.constexpr = D // B
    col = tl.arange(0, NB)[:, None] * B + tl.arange(0, B)[None, :]
    x = tl.load(x_ptr + r * stride_x + col).to(tl.float32)
    y, s, _ = _v41_scaled(x, PACK)
    if PACK == 1:
        v = e4m3_grid(y)
    else:
        v = e2m1_value(_e2m1_code(y))
    tl.store(out_ptr + r * stride_o + col, (v * s[:, None]).to(out_ptr.dtype.element_ty))


@triton.jit
def _index_query_kernel(q_ptr, w_ptr, pos_ptr, freq_ptr, q_out_ptr, w_out_ptr, H, stride_qt, stride_qh, R2,
                        w_scale, D: tl.constexpr, B: tl.constexpr, PACK: tl.constexpr,
                        PDL: tl.constexpr = False):  # fmt: skip
    """Program ``t * H + h``: query row ``q[t, h]`` rotated at ``pos[t]`` as ``_rope_kernel`` rotates it (rounded
    to the query's dtype), then, with ``PACK``, round-tripped as :func:`_roundtrip_v41_kernel` does; and the head
    weight ``w[t, h]`` widened to float32 and scaled (``compose_index_query``)."""
    pdl_enter(PDL)
    r = tl.program_id(0)
    t = (r // H).to(tl.int64)
    h = r % H
    d = tl.arange(0, D)
    x = tl.load(q_ptr + t * stride_qt + h * stride_qh + d).to(tl.float32)
    ty = q_out_ptr.dtype.element_ty
    y = rope_row(x, tl.load(pos_ptr + t).to(tl.float32), freq_ptr, D, R2, D).to(ty)
    if PACK:
        y2 = tl.reshape(y.to(tl.float32), (D // B, B))
        v, s, _ = _v41_scaled(y2, PACK)
        if PACK == 1:
            v = e4m3_grid(v)
        else:
            v = e2m1_value(_e2m1_code(v))
        y = tl.reshape((v * s[:, None]).to(ty), (D,))
    tl.store(q_out_ptr + r.to(tl.int64) * D + d, y)
    tl.store(w_out_ptr + r, tl.load(w_ptr + t * H + h).to(tl.float32) * w_scale)


def v41_store_kind(fmt, d: int) -> int:
    """``PACK`` of a V4.1 codec (``PackedKV``) with one row of ``d`` values this store writes (the formats the
    attention kernel reads, ``sparse_attention.packed_layout``, with power-of-two blocks and block counts), else
    0."""
    layout = packed_layout(fmt, d)
    if layout is None:
        return 0
    kind, _, block = layout
    pow2_ok = triton.next_power_of_2(block) == block and triton.next_power_of_2(d // block) == d // block
    return kind if pow2_ok else 0


def store_v41(pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, fmt) -> None:
    """``pool[slots] = fmt.pack(values)`` for a flat byte pool ``[S, entry_bytes]`` and a codec of
    :func:`v41_store_kind`, one launch."""
    n, d = values.shape
    if n == 0:
        return
    values = values if values.stride(-1) == 1 else values.contiguous()
    _pack_v41_kernel[(n,)](
        values, slots.contiguous(), pool, values.stride(0), pool.shape[0],
        ROW=fmt.fmt.entry_bytes, D=d, B=fmt.fmt.block, PACK=v41_store_kind(fmt, d), num_warps=4,
        **dispatch.pdl_args(n),
    )  # fmt: skip


def norm_rope_store_v41(pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                        eps: float, positions: torch.Tensor, inv_freq: torch.Tensor, fmt) -> None:  # fmt: skip
    """``pool[slots] = fmt.pack(rms_norm_rope(x[:, None], weight, eps, positions, inv_freq)[:, 0])`` for a flat
    byte pool and a codec of :func:`v41_store_kind`, one launch (``compose_rms_norm_rope_store_kv``)."""
    n, d = x.shape
    if n == 0:
        return
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = weight.contiguous() if weight is not None else x  # widened as the kernel loads it
    _norm_rope_pack_v41_kernel[(n,)](
        x, w, positions.contiguous(), inv_freq.float().contiguous(), slots.contiguous(), pool, x.stride(0),
        pool.shape[0], inv_freq.numel(), eps,
        ROW=fmt.fmt.entry_bytes, D=d, B=fmt.fmt.block, PACK=v41_store_kind(fmt, d), HAS_W=weight is not None,
        num_warps=4, **dispatch.pdl_args(n),
    )  # fmt: skip


def index_query(q: torch.Tensor, weights: torch.Tensor, weight_scale: float, positions: torch.Tensor,
                inv_freq: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``compose_index_query`` in one launch: ``q [T, H, D]`` rotated and (a codec of :func:`v41_store_kind`, or
    ``None``: rotated only) round-tripped, ``weights [T, H]`` as float32 times ``weight_scale``."""
    T, H, D = q.shape
    out = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
    w_out = torch.empty((T, H), dtype=torch.float32, device=q.device)
    if T * H == 0:
        return out, w_out
    q = q if q.stride(-1) == 1 else q.contiguous()
    weights = weights.contiguous()
    _index_query_kernel[(T * H,)](
        q, weights, positions.contiguous(), inv_freq.float().contiguous(), out, w_out, H, q.stride(0), q.stride(1),
        inv_freq.numel(), weight_scale, D=D, B=fmt.fmt.block if fmt is not None else D,
        PACK=v41_store_kind(fmt, D) if fmt is not None else 0, num_warps=1 if D <= 128 else 4,
        **dispatch.pdl_args(T),
    )  # fmt: skip
    return out, w_out


def roundtrip_v41(values: torch.Tensor, fmt) -> torch.Tensor:
    """``fmt.roundtrip(values)`` (``values [N, D]``, a codec of :func:`v41_store_kind`) in one launch: V4.1's
    index queries through the index keys' FP4 format (about 35 torch launches in the codec's own pack and
    unpack)."""
    n, d = values.shape
    out = torch.empty_like(values)
    if n == 0:
        return out
    values = values if values.stride(-1) == 1 else values.contiguous()
    _roundtrip_v41_kernel[(n,)](
        values, out, values.stride(0), out.stride(0), D=d, B=fmt.fmt.block, PACK=v41_store_kind(fmt, d),
        num_warps=4, **dispatch.pdl_args(n),
    )  # fmt: skip
    return out
