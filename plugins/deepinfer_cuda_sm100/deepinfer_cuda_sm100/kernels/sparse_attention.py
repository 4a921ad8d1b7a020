"""Sparse shared-KV attention with a learned sink per head, over slot indices.

One program handles one query token and ``BLOCK_H`` heads: it gathers ``BLOCK_N`` KV rows at a time
by slot id (K = V, one KV head shared by all query heads) and runs an online softmax in base 2.
The sink enters as the softmax's starting point (running max = sink, running sum = 1), so a row
whose slots are all padding returns zeros without a special case. Window slots and compressed
slots are two loops over two pools that feed the same running state. Decode and prefill are the
same kernel: every query token carries its own slot lists. With an FP8 KV cache the pools are packed byte
rows (``deepinfer_core.ops.kv_fp8``) decoded in registers as the tile is loaded. DeepSeek-V4.1's packed entries
(``deepinfer_core.kv.packed``: codes, then one scale byte per ``SB`` values) are decoded the same way, each
pool with its own format (``KV_PACK`` / ``CMP_PACK``): 1 = e4m3 codes with ue8m0 scales (the window KV), 2 = e2m1
codes (two per byte, low nibble first) with e4m3 scales (the compressed KV), 3 = e2m1 with ue8m0.

Split-KV (flash decoding): with few query tokens (``T * H / BLOCK_H`` programs well under the SM count; at
batch 1 that is 2 programs for 64 heads) the window and compressed slot lists, taken as one list, are cut
into ``splits`` chunks of whole tiles, one program each. A chunk's program starts without the sink (running
max ``-1e30``, sum 0) and writes its unnormalised state ``(m, l, acc)``; :func:`_combine_kernel` folds the
chunks into the sink's starting state and divides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.plugin_api import FP8_KV_GROUP as GROUP
from deepinfer_core.plugin_api import Fp8KVFormat
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import dot_dtype, e2m1_value, mma, pdl_enter, pow2
from deepinfer_cuda_sm100.kernels.norm_rope import rope, rope_row, rope_tile

LOG2E = 1.4426950408889634


@triton.jit
def _load_kv(pool_ptr, rope_ptr, scale_ptr, slot, valid, d, dmask, stride_pool, NOPE, NG, ROPE_ROW, ROPE_OFF,
             SCALE_ROW, SCALE_OFF, FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, OUT_T: tl.constexpr):  # fmt: skip
    """``[BLOCK_N, BLOCK_D]`` KV rows at ``slot``: plain rows, or packed FP8 rows (``pool_ptr`` the e4m3 view,
    ``rope_ptr`` the model-dtype view, ``scale_ptr`` the float32 view of the same bytes) decoded exactly as
    ``Fp8KVFormat.unpack``: ``code * scale`` for the first ``NOPE`` channels, the RoPE channels as stored.
    ``FP8 == 1``: the ``NG`` scales of a row are loaded once, as ``[BLOCK_N, BLOCK_D // GROUP]``, and broadcast
    per group through two reshapes. ``FP8 == 2`` (``dispatch.fp8_kv_mode``): each channel loads its group's
    scale (a gather whose ``GROUP`` neighbours read one word, as ``_load_packed`` reads V4.1's scales), no
    reshape. The same products either way. ``FP8 == 3``: as 1, with the RoPE channels left zero (the attention
    reads them as a tile of their own, :func:`_load_rope`). In ``OUT_T`` (the dot's type): the products rounded to it, the RoPE
    channels converted from the model dtype, so no float32 tile of the RoPE channels, nor of the merged row, is
    held (the same values as merging in float32, then rounding: the model dtype widens exactly)."""
    m = valid[:, None] & dmask[None, :]
    if FP8:
        code = d < NOPE
        c = tl.load(pool_ptr + slot[:, None] * stride_pool + d[None, :], mask=m & code[None, :], other=0.0)
        c = c.to(tl.float32)
        if FP8 == 2:
            sc = tl.load(scale_ptr + slot[:, None] * SCALE_ROW + SCALE_OFF + (d // GROUP)[None, :],
                         mask=m & code[None, :], other=0.0)  # fmt: skip
            c = c * sc
        elif BLOCK_D <= GROUP:
            sc = tl.load(scale_ptr + slot * SCALE_ROW + SCALE_OFF, mask=valid, other=0.0)
            c = c * sc[:, None]
        else:
            g = tl.arange(0, BLOCK_D // GROUP)
            sc = tl.load(scale_ptr + slot[:, None] * SCALE_ROW + SCALE_OFF + g[None, :],
                         mask=valid[:, None] & (g < NG)[None, :], other=0.0)  # fmt: skip
            c = tl.reshape(
                tl.reshape(c, [BLOCK_N, BLOCK_D // GROUP, GROUP]) * sc[:, :, None], [BLOCK_N, BLOCK_D]
            )
        if FP8 == 3:  # the RoPE channels are their own tile (_load_rope): here zeros
            return c.to(OUT_T)
        r = tl.load(rope_ptr + slot[:, None] * ROPE_ROW + ROPE_OFF + (d - NOPE)[None, :],
                    mask=m & (~code)[None, :], other=0.0)  # fmt: skip
        return tl.where(code[None, :], c.to(OUT_T), r.to(OUT_T))
    else:
        return tl.load(pool_ptr + slot[:, None] * stride_pool + d[None, :], mask=m, other=0.0).to(OUT_T)


@triton.jit
def _load_rope(rope_ptr, slot, valid, ROPE_ROW, ROPE_OFF, ROPE_D: tl.constexpr, OUT_T: tl.constexpr):
    """``[BLOCK_N, ROPE_D]``: the RoPE channels of V4's FP8 rows at ``slot``, as stored (``FP8 == 3``)."""
    r = tl.arange(0, ROPE_D)
    k = tl.load(rope_ptr + slot[:, None] * ROPE_ROW + ROPE_OFF + r[None, :], mask=valid[:, None], other=0.0)
    return k.to(OUT_T)


@triton.jit
def _load_packed(u8_ptr, e4m3_ptr, slot, valid, d, dmask, stride_pool, PACK: tl.constexpr, CODE_BYTES: tl.constexpr,
                 SB: tl.constexpr):  # fmt: skip
    """``[BLOCK_N, BLOCK_D]`` values of V4.1 packed entries at ``slot`` (``u8_ptr`` / ``e4m3_ptr``: the byte pool
    read as bytes / as e4m3), ``code * scale`` as ``PackedKV.unpack`` computes them (exact in float32)."""
    m = valid[:, None] & dmask[None, :]
    row = slot[:, None].to(tl.int64) * stride_pool
    sbyte = row + CODE_BYTES + (d // SB)[None, :]
    if PACK == 2:  # e4m3 scales
        scale = tl.load(e4m3_ptr + sbyte, mask=m, other=0.0).to(tl.float32)
    else:  # ue8m0: the byte is a float32 exponent (byte 0, 2**-127, reads as 0 as in the GEMMs)
        scale = (tl.load(u8_ptr + sbyte, mask=m, other=0).to(tl.int32) << 23).to(tl.float32, bitcast=True)
    if PACK == 1:  # e4m3 codes, one byte each
        code = tl.load(e4m3_ptr + row + d[None, :], mask=m, other=0.0).to(tl.float32)
    else:  # e2m1 codes, two per byte, value 2i in the low nibble; bit 3 the sign
        b = tl.load(u8_ptr + row + (d // 2)[None, :], mask=m, other=0).to(tl.int32)
        code = e2m1_value((b >> ((d % 2) * 4)[None, :]) & 15)
    return code * scale


@triton.jit
def _packed_scales(u8_ptr, e4m3_ptr, row, valid, PACK: tl.constexpr, CODE_BYTES: tl.constexpr, SB: tl.constexpr,
                   BLOCK_D: tl.constexpr):  # fmt: skip
    """``[BLOCK_N, BLOCK_D // SB]`` float32 scales of the entries at byte offsets ``row`` (``[BLOCK_N, 1]``), each
    scale byte loaded once."""
    g = tl.arange(0, BLOCK_D // SB)[None, :]
    m = valid[:, None] & (g >= 0)
    if PACK == 2:  # e4m3 scales
        return tl.load(e4m3_ptr + row + CODE_BYTES + g, mask=m, other=0.0).to(tl.float32)
    return (tl.load(u8_ptr + row + CODE_BYTES + g, mask=m, other=0).to(tl.int32) << 23).to(
        tl.float32, bitcast=True
    )


@triton.jit
def _load_packed_tile(u8_ptr, e4m3_ptr, slot, valid, stride_pool, PACK: tl.constexpr, CODE_BYTES: tl.constexpr,
                      SB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """:func:`_load_packed` for entries of exactly ``BLOCK_D`` values, the same products: each code byte loaded
    once (e2m1: both nibbles decoded and interleaved by ``tl.join``, not every byte loaded twice) and each scale
    once, broadcast over its ``SB`` values through reshapes (not gathered per value): the decode, not the bytes,
    sets these loops' time (``benchmarks/gpu/v41_kv_variants.py``; RESULTS v36)."""
    row = slot[:, None].to(tl.int64) * stride_pool
    if PACK == 1:  # e4m3 codes, one byte each
        d = tl.arange(0, BLOCK_D)[None, :]
        code = tl.load(e4m3_ptr + row + d, mask=valid[:, None] & (d >= 0), other=0.0).to(tl.float32)
    else:  # e2m1, two per byte, value 2i in the low nibble
        i = tl.arange(0, BLOCK_D // 2)[None, :]
        b = tl.load(u8_ptr + row + i, mask=valid[:, None] & (i >= 0), other=0).to(tl.int32)
        code = tl.reshape(tl.join(e2m1_value(b & 15), e2m1_value(b >> 4)), [BLOCK_N, BLOCK_D])
    sc = _packed_scales(u8_ptr, e4m3_ptr, row, valid, PACK, CODE_BYTES, SB, BLOCK_D)
    return tl.reshape(tl.reshape(code, [BLOCK_N, BLOCK_D // SB, SB]) * sc[:, :, None], [BLOCK_N, BLOCK_D])


@triton.jit
def _attend(q, pool_ptr, rope_ptr, scale_ptr, slots_ptr, start, end, stride_pool, d, dmask, m_i, l_i, acc, qk_scale,
            NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF, DOT_T: tl.constexpr, BLOCK_N: tl.constexpr,
            FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_D: tl.constexpr, PACK: tl.constexpr,
            CODE_BYTES: tl.constexpr, SB: tl.constexpr, PACKED_TILE: tl.constexpr, q_rope, acc_rope,
            ROPE_D: tl.constexpr):  # fmt: skip
    """``PACK > 0``: V4.1 packed entries (:func:`_load_packed`, or :func:`_load_packed_tile` with
    ``PACKED_TILE``: entries of exactly ``BLOCK_D`` values; ``pool_ptr`` the byte view, ``rope_ptr`` the e4m3
    view). ``FP8 == 3``: V4's FP8 rows with their ``ROPE_D`` RoPE channels as a tile of their own, never merged
    into the code tile: the scores are two dots (``q_rope`` with the RoPE tile, ``q`` with the code tile, whose
    RoPE channels are zero), and the values' RoPE channels sum into ``acc_rope``. Returns ``acc_rope`` too."""
    cols = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        slot = tl.load(slots_ptr + n0 + cols, mask=n0 + cols < end, other=-1)
        valid = slot >= 0
        if PACK > 0 and PACKED_TILE:
            k = _load_packed_tile(
                pool_ptr, rope_ptr, slot, valid, stride_pool, PACK, CODE_BYTES, SB, BLOCK_N, BLOCK_D
            )
        elif PACK > 0:
            k = _load_packed(pool_ptr, rope_ptr, slot, valid, d, dmask, stride_pool, PACK, CODE_BYTES, SB)
        else:
            k = _load_kv(pool_ptr, rope_ptr, scale_ptr, slot, valid, d, dmask, stride_pool, NOPE, NG, ROPE_ROW,
                         ROPE_OFF, SCALE_ROW, SCALE_OFF, FP8, GROUP, BLOCK_N, BLOCK_D, DOT_T)  # fmt: skip
        k = k.to(DOT_T)
        if FP8 == 3:
            kr = _load_rope(rope_ptr, slot, valid, ROPE_ROW, ROPE_OFF, ROPE_D, DOT_T)
            s = mma(q_rope, tl.trans(kr), mma(q, tl.trans(k), None, DOT_T), DOT_T) * qk_scale
        else:
            s = mma(q, tl.trans(k), None, DOT_T) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + mma(p.to(DOT_T), k, None, DOT_T)
        if FP8 == 3:
            acc_rope = acc_rope * alpha[:, None] + mma(p.to(DOT_T), kr, None, DOT_T)
        m_i = m_new
    return m_i, l_i, acc, acc_rope


@triton.jit
def _sparse_attn_kernel(
    q_ptr, kv_ptr, kv_rope_ptr, kv_scale_ptr, kv_slots_ptr, cmp_ptr, cmp_rope_ptr, cmp_scale_ptr, cmp_slots_ptr,
    sinks_ptr, out_ptr, part_ptr, ml_ptr, pos_ptr, freq_ptr,
    H, D, n_kv, n_cmp, CHUNK,
    stride_qt, stride_qh, stride_kv, stride_kvs, stride_cmp, stride_cmps, stride_ot, stride_oh,
    qk_scale, NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF, R2, q_eps,
    HAS_CMP: tl.constexpr, DOT_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    FP8: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr,
    KV_PACK: tl.constexpr = 0, KV_CODE: tl.constexpr = 0, KV_SB: tl.constexpr = 1,
    CMP_PACK: tl.constexpr = 0, CMP_CODE: tl.constexpr = 0, CMP_SB: tl.constexpr = 1,
    ROPE_Q: tl.constexpr = False, Q_NORM: tl.constexpr = False, PACKED_TILE: tl.constexpr = False,
    ROPE_D: tl.constexpr = 16, PDL: tl.constexpr = False,
):  # fmt: skip
    """``SPLIT``: program ``(t, h, s)`` covers slots ``[s * CHUNK, (s + 1) * CHUNK)`` of the window list followed
    by the compressed list and writes ``acc`` to ``part[t, s, heads]`` and ``(m, l)`` to ``ml[t, s, heads]``.
    ``ROPE_Q``: the query rows rotated at ``pos[t]`` (the trailing ``2 * R2`` channels, ``freq``) as they are
    loaded, each rounded to the query's dtype as the rope op rounds it; ``Q_NORM``: first normed (no weight,
    ``q_eps``) and rounded, as ``rms_norm_rope`` does (``compose_rope_sparse_attention_unrope``). ``FP8 == 3``:
    the last ``ROPE_D`` channels (``NOPE = D - ROPE_D``, a multiple of it, and ``D == BLOCK_D``) attend as a tile of
    their own (:func:`_attend`), and are stored from their own accumulator."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = heads < H
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(
        q_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=hm[:, None] & dm[None, :],
        other=0.0,
    )
    if ROPE_Q:
        qf = q.to(tl.float32)
        if Q_NORM:
            qf = qf * (1.0 / tl.sqrt(tl.sum(qf * qf, axis=1) / D + q_eps))[:, None]
            qf = qf.to(q_ptr.dtype.element_ty).to(tl.float32)
        qf = rope_tile(qf, tl.load(pos_ptr + t).to(tl.float32), freq_ptr, D, R2, BLOCK_H, BLOCK_D)
        q = qf.to(q_ptr.dtype.element_ty)
    q = q.to(DOT_T)
    if SPLIT:
        lo = tl.program_id(2) * CHUNK
        hi = lo + CHUNK
        m_i = tl.full([BLOCK_H], -1e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    else:
        lo = 0
        hi = n_kv + n_cmp
        m_i = tl.load(sinks_ptr + heads, mask=hm, other=0.0) * 1.4426950408889634
        l_i = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    acc_rope = tl.zeros([BLOCK_H, ROPE_D], dtype=tl.float32)
    rd = tl.arange(0, ROPE_D)
    if FP8 == 3:  # the query's RoPE channels: the last of the tile's ROPE_D-wide groups, picked out exactly
        grp = tl.arange(0, BLOCK_D // ROPE_D)
        q3 = tl.reshape(q.to(tl.float32), [BLOCK_H, BLOCK_D // ROPE_D, ROPE_D])
        q_rope = tl.sum(tl.where((grp == NOPE // ROPE_D)[None, :, None], q3, 0.0), axis=1).to(DOT_T)
    else:
        q_rope = tl.zeros([BLOCK_H, ROPE_D], dtype=DOT_T)
    m_i, l_i, acc, acc_rope = _attend(q, kv_ptr, kv_rope_ptr, kv_scale_ptr, kv_slots_ptr + t * stride_kvs, tl.minimum(lo, n_kv),
                            tl.minimum(hi, n_kv), stride_kv, d, dm, m_i, l_i, acc, qk_scale, NOPE, NG, ROPE_ROW,
                            ROPE_OFF, SCALE_ROW, SCALE_OFF, DOT_T, BLOCK_N, FP8, GROUP, BLOCK_D, KV_PACK, KV_CODE,
                            KV_SB, PACKED_TILE, q_rope, acc_rope, ROPE_D)  # fmt: skip
    if HAS_CMP:
        m_i, l_i, acc, acc_rope = _attend(q, cmp_ptr, cmp_rope_ptr, cmp_scale_ptr, cmp_slots_ptr + t * stride_cmps,
                                tl.maximum(lo - n_kv, 0), tl.maximum(tl.minimum(hi - n_kv, n_cmp), 0), stride_cmp, d,
                                dm, m_i, l_i, acc, qk_scale, NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF, DOT_T,
                                BLOCK_N, FP8, GROUP, BLOCK_D, CMP_PACK, CMP_CODE, CMP_SB, PACKED_TILE, q_rope,
                                acc_rope, ROPE_D)  # fmt: skip
    if SPLIT:
        row = (t * tl.num_programs(2) + tl.program_id(2)) * H + heads
        if FP8 == 3:  # the RoPE channels from acc_rope
            tl.store(
                part_ptr + row[:, None] * BLOCK_D + d[None, :], acc, mask=hm[:, None] & (d < NOPE)[None, :]
            )
            tl.store(part_ptr + row[:, None] * BLOCK_D + NOPE + rd[None, :], acc_rope, mask=hm[:, None])
        else:
            tl.store(part_ptr + row[:, None] * BLOCK_D + d[None, :], acc, mask=hm[:, None])
        tl.store(ml_ptr + row * 2, m_i, mask=hm)
        tl.store(ml_ptr + row * 2 + 1, l_i, mask=hm)
    else:
        out_rows = out_ptr + t * stride_ot + heads[:, None] * stride_oh
        if FP8 == 3:
            dm = dm & (d < NOPE)  # the RoPE channels from acc_rope
        tl.store(out_rows + d[None, :], (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
                 mask=hm[:, None] & dm[None, :])  # fmt: skip
        if FP8 == 3:
            tl.store(out_rows + NOPE + rd[None, :], (acc_rope / l_i[:, None]).to(out_ptr.dtype.element_ty),
                     mask=hm[:, None])  # fmt: skip


@triton.jit
def _combine_kernel(
    part_ptr,
    ml_ptr,
    sinks_ptr,
    out_ptr,
    H,
    D,
    S,
    stride_ot,
    stride_oh,
    pos_ptr,
    freq_ptr,
    R2,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    UNROPE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Program ``(t, h)``: the sink's state (max = sink, sum 1, no value) merged with the ``S`` chunk states,
    ``BLOCK_S`` chunks a step, each step's states loaded together (one chunk after another was a chain of
    ``S`` dependent loads: ~20 us for 20 chunks at batch 1 on the H200, v26). ``UNROPE``: the row, rounded to the
    output dtype as the attention's output is, then rotated back at ``pos[t]`` (``rope(..., inverse=True)`` over
    the trailing ``2 * R2`` channels, ``freq``) before it is stored: the output projection's input, one launch
    fewer."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    m_i = tl.load(sinks_ptr + h) * 1.4426950408889634
    l_i = 1.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        sm = s < S
        row = (t * S + s) * H + h
        m_s = tl.load(ml_ptr + row * 2, mask=sm, other=-1e30)
        l_s = tl.load(ml_ptr + row * 2 + 1, mask=sm, other=0.0)
        part = tl.load(part_ptr + row[:, None] * BLOCK_D + d[None, :], mask=sm[:, None], other=0.0)
        m_new = tl.maximum(m_i, tl.max(m_s, axis=0))
        a = tl.exp2(m_i - m_new)
        b = tl.exp2(m_s - m_new)
        l_i = l_i * a + tl.sum(l_s * b, axis=0)
        acc = acc * a + tl.sum(part * b[:, None], axis=0)
        m_i = m_new
    y = (acc / l_i).to(out_ptr.dtype.element_ty)
    if UNROPE:
        y = rope_row(y.to(tl.float32), tl.load(pos_ptr + t).to(tl.float32), freq_ptr, D, R2, BLOCK_D, -1.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, y.to(out_ptr.dtype.element_ty), mask=d < D)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


#: V4.1 packed entries of a power-of-two width decoded a tile at a time (:func:`_load_packed_tile`; False: a
#: gather per value, :func:`_load_packed`; the same products)
PACKED_TILES = True
#: V4.1 packed entries the kernel decodes: (code format, scale format) -> ``PACK``
PACK_KINDS = {("e4m3", "ue8m0"): 1, ("e2m1", "e4m3"): 2, ("e2m1", "ue8m0"): 3}


def packed_layout(fmt, d: int) -> tuple[int, int, int] | None:
    """``(PACK, code bytes, values per scale)`` of a V4.1 codec (``PackedKV``) whose entry is one row of ``d``
    values, or None when the kernel does not decode it (the caller unpacks instead)."""
    p = getattr(fmt, "fmt", None)
    kind = PACK_KINDS.get((getattr(p, "values", None), getattr(p, "scales", None)))
    if kind is None or tuple(p.shape) != (d,):
        return None
    return kind, p.code_bytes, p.block


def _views(pool: torch.Tensor, fmt: Fp8KVFormat | None, pack: int = 0) -> tuple[torch.Tensor, ...]:
    """The pointers a pool is read through: itself three times, a V4 FP8 pool's e4m3 / RoPE / scale views, or a
    V4.1 packed pool's byte / e4m3 / byte views."""
    if pack:
        return pool, pool.view(torch.float8_e4m3fn), pool
    if fmt is None:
        return pool, pool, pool
    return pool.view(torch.float8_e4m3fn), pool.view(fmt.rope_dtype), pool.view(torch.float32)


def sparse_attention(
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_slots: torch.Tensor,
    cmp_pool: torch.Tensor | None,
    cmp_slots: torch.Tensor | None,
    sinks: torch.Tensor,
    scale: float,
    kv_format: Fp8KVFormat | None = None,
    splits: int | None = None,
    kv_pack: tuple[int, int, int] | None = None,
    cmp_pack: tuple[int, int, int] | None = None,
    unrope: tuple[torch.Tensor, torch.Tensor] | None = None,
    rope_q: bool = False,
    q_norm_eps: float | None = None,
) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.attention.AttentionOps.sparse_attention`. ``splits``: split-KV chunks
    (default: :func:`dispatch.attention_splits`; 1 = one program per token and head block). ``kv_pack`` /
    ``cmp_pack``: a pool of V4.1 packed entries, as :func:`packed_layout` describes it (``kv_format`` then
    ``None``). ``unrope``: ``(positions, inv_freq)``, the output rotated back (``compose_sparse_attention_unrope``):
    in the split-KV combine kernel, else by a rope launch after the attention's. ``rope_q`` (with ``unrope``):
    the query rotated at the same positions as the kernel loads it, ``q_norm_eps``: normed per head first
    (``compose_rope_sparse_attention_unrope``)."""
    if rope_q and unrope is None:
        raise ValueError("sparse_attention: rope_q needs unrope=(positions, inv_freq)")
    T, H, D = q.shape
    out = torch.empty_like(q)
    if T == 0:
        return out
    q, kv_pool, kv_slots = _rows(q), _rows(kv_pool), kv_slots.contiguous()
    has_cmp = cmp_pool is not None and cmp_slots is not None and cmp_slots.shape[-1] > 0
    if has_cmp:
        cmp_pool, cmp_slots = _rows(cmp_pool), cmp_slots.contiguous()
    else:
        cmp_pool, cmp_slots = kv_pool, kv_slots
    fmt = kv_format
    layout = (0,) * 6  # NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF (in elements of each view)
    if fmt is not None:
        rs = fmt.rope_dtype.itemsize
        layout = (fmt.nope, fmt.num_scales, fmt.row_bytes // rs, fmt.rope_offset // rs, fmt.row_bytes // 4,
                  fmt.scale_offset // 4)  # fmt: skip
    kv_pack = kv_pack or (0, 0, 1)
    cmp_pack = (cmp_pack or (0, 0, 1)) if has_cmp else kv_pack
    n_kv, n_cmp = kv_slots.shape[1], cmp_slots.shape[1] if has_cmp else 0
    packed = kv_pack[0] > 0 or cmp_pack[0] > 0
    cfg = dispatch.attention_config(T, H, D, n_kv + n_cmp, fp8=fmt is not None, packed=packed)
    hb = triton.cdiv(H, cfg.block_h)
    splits = dispatch.attention_splits(T * hb, n_kv + n_cmp, cfg.block_n) if splits is None else splits
    chunk = triton.cdiv(triton.cdiv(n_kv + n_cmp, max(splits, 1)), cfg.block_n) * cfg.block_n
    splits = triton.cdiv(n_kv + n_cmp, chunk) if splits > 1 else 1
    bd = pow2(D, 16)
    fp8_mode, rope_d = (dispatch.fp8_kv_mode() if fmt is not None else 0), 16
    if fp8_mode == 3:
        rope_d = D - fmt.nope
        if not (rope_d >= 16 and pow2(rope_d) == rope_d and fmt.nope % rope_d == 0 and bd == D):
            fp8_mode, rope_d = 1, 16  # RoPE channels apart need them to be the tile's last power-of-two group
    part = ml = out
    if splits > 1:
        part = torch.empty((T, splits, H, bd), dtype=torch.float32, device=q.device)
        ml = torch.empty((T, splits, H, 2), dtype=torch.float32, device=q.device)
    sinks = sinks.float().contiguous()
    pos, freq = unrope if unrope is not None else (sinks, sinks)
    pos = pos.contiguous()
    freq = freq.float().contiguous()
    _sparse_attn_kernel[(T, hb, splits)](
        q, *_views(kv_pool, fmt, kv_pack[0]), kv_slots, *_views(cmp_pool, fmt, cmp_pack[0]), cmp_slots, sinks, out,
        part, ml, pos, freq,
        H, D, n_kv, n_cmp, chunk,
        q.stride(0), q.stride(1), kv_pool.stride(0), kv_slots.stride(0), cmp_pool.stride(0), cmp_slots.stride(0),
        out.stride(0), out.stride(1), scale * LOG2E, *layout, freq.numel(), q_norm_eps or 0.0,
        HAS_CMP=has_cmp, DOT_T=dot_dtype(q.dtype), BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_D=bd,
        FP8=fp8_mode, ROPE_D=rope_d, GROUP=GROUP, SPLIT=splits > 1, KV_PACK=kv_pack[0],
        KV_CODE=kv_pack[1], KV_SB=kv_pack[2],
        CMP_PACK=cmp_pack[0], CMP_CODE=cmp_pack[1], CMP_SB=cmp_pack[2], ROPE_Q=rope_q, Q_NORM=rope_q and q_norm_eps is not None,
        PACKED_TILE=packed and bd == D and PACKED_TILES,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dispatch.pdl_args(T),
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(T, H)](part, ml, sinks, out, H, D, splits, out.stride(0), out.stride(1), pos, freq,
                                freq.numel(), BLOCK_D=bd, BLOCK_S=min(pow2(splits, 2), max(2, 8192 // bd)),
                                UNROPE=unrope is not None, num_warps=4, **dispatch.pdl_args(T))  # fmt: skip
    elif unrope is not None:
        return rope(out, unrope[0], unrope[1], inverse=True)
    return out
