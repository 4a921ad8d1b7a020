"""Sparse shared-KV attention with a learned sink per head, over slot indices.

One program handles one query token and ``BLOCK_H`` heads: it gathers ``BLOCK_N`` KV rows at a time
by slot id (K = V, one KV head shared by all query heads) and runs an online softmax in base 2.
The sink enters as the softmax's starting point (running max = sink, running sum = 1), so a row
whose slots are all padding returns zeros without a special case. Window slots and compressed
slots are two loops over two pools that feed the same running state. Decode and prefill are the
same kernel: every query token carries its own slot lists. With an FP8 KV cache the pools are packed byte
rows (``deepinfer_core.kv.fp8``) decoded in registers as the tile is loaded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.kv.fp8 import GROUP, Fp8KVFormat
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import dot_dtype, mma, pow2

LOG2E = 1.4426950408889634


@triton.jit
def _load_kv(pool_ptr, rope_ptr, scale_ptr, slot, valid, d, dmask, stride_pool, NOPE, NG, ROPE_ROW, ROPE_OFF,
             SCALE_ROW, SCALE_OFF, FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr):  # fmt: skip
    """``[BLOCK_N, BLOCK_D]`` KV rows at ``slot``: plain rows, or packed FP8 rows (``pool_ptr`` the e4m3 view,
    ``rope_ptr`` the model-dtype view, ``scale_ptr`` the float32 view of the same bytes) decoded exactly as
    ``Fp8KVFormat.unpack``: ``code * scale`` for the first ``NOPE`` channels, the RoPE channels as stored.
    The ``NG`` scales of a row are loaded once, as ``[BLOCK_N, BLOCK_D // GROUP]``, and broadcast per group."""
    m = valid[:, None] & dmask[None, :]
    if FP8:
        code = d < NOPE
        c = tl.load(pool_ptr + slot[:, None] * stride_pool + d[None, :], mask=m & code[None, :], other=0.0)
        c = c.to(tl.float32)
        if BLOCK_D <= GROUP:
            sc = tl.load(scale_ptr + slot * SCALE_ROW + SCALE_OFF, mask=valid, other=0.0)
            c = c * sc[:, None]
        else:
            g = tl.arange(0, BLOCK_D // GROUP)
            sc = tl.load(scale_ptr + slot[:, None] * SCALE_ROW + SCALE_OFF + g[None, :],
                         mask=valid[:, None] & (g < NG)[None, :], other=0.0)  # fmt: skip
            c = tl.reshape(
                tl.reshape(c, [BLOCK_N, BLOCK_D // GROUP, GROUP]) * sc[:, :, None], [BLOCK_N, BLOCK_D]
            )
        r = tl.load(rope_ptr + slot[:, None] * ROPE_ROW + ROPE_OFF + (d - NOPE)[None, :],
                    mask=m & (~code)[None, :], other=0.0)  # fmt: skip
        return tl.where(code[None, :], c, r.to(tl.float32))
    else:
        return tl.load(pool_ptr + slot[:, None] * stride_pool + d[None, :], mask=m, other=0.0)


@triton.jit
def _attend(q, pool_ptr, rope_ptr, scale_ptr, slots_ptr, n_slots, stride_pool, d, dmask, m_i, l_i, acc, qk_scale,
            NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF, DOT_T: tl.constexpr, BLOCK_N: tl.constexpr,
            FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    for n0 in range(0, n_slots, BLOCK_N):
        slot = tl.load(slots_ptr + n0 + cols, mask=n0 + cols < n_slots, other=-1)
        valid = slot >= 0
        k = _load_kv(pool_ptr, rope_ptr, scale_ptr, slot, valid, d, dmask, stride_pool, NOPE, NG, ROPE_ROW, ROPE_OFF,
                     SCALE_ROW, SCALE_OFF, FP8, GROUP, BLOCK_N, BLOCK_D)  # fmt: skip
        k = k.to(DOT_T)
        s = mma(q, tl.trans(k), None, DOT_T) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + mma(p.to(DOT_T), k, None, DOT_T)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _sparse_attn_kernel(
    q_ptr, kv_ptr, kv_rope_ptr, kv_scale_ptr, kv_slots_ptr, cmp_ptr, cmp_rope_ptr, cmp_scale_ptr, cmp_slots_ptr,
    sinks_ptr, out_ptr,
    H, D, n_kv, n_cmp,
    stride_qt, stride_qh, stride_kv, stride_kvs, stride_cmp, stride_cmps, stride_ot, stride_oh,
    qk_scale, NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF,
    HAS_CMP: tl.constexpr, DOT_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    FP8: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
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
    q = q.to(DOT_T)
    m_i = tl.load(sinks_ptr + heads, mask=hm, other=0.0) * 1.4426950408889634
    l_i = tl.full([BLOCK_H], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    m_i, l_i, acc = _attend(q, kv_ptr, kv_rope_ptr, kv_scale_ptr, kv_slots_ptr + t * stride_kvs, n_kv, stride_kv, d,
                            dm, m_i, l_i, acc, qk_scale, NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF,
                            DOT_T, BLOCK_N, FP8, GROUP, BLOCK_D)  # fmt: skip
    if HAS_CMP:
        m_i, l_i, acc = _attend(q, cmp_ptr, cmp_rope_ptr, cmp_scale_ptr, cmp_slots_ptr + t * stride_cmps, n_cmp,
                                stride_cmp, d, dm, m_i, l_i, acc, qk_scale, NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW,
                                SCALE_OFF, DOT_T, BLOCK_N, FP8, GROUP, BLOCK_D)  # fmt: skip
    out = acc / l_i[:, None]
    tl.store(out_ptr + t * stride_ot + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=hm[:, None] & dm[None, :])  # fmt: skip


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _views(pool: torch.Tensor, fmt: Fp8KVFormat | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pointers a pool is read through: itself three times, or a packed pool's e4m3 / RoPE / scale views."""
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
) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.attention.AttentionOps.sparse_attention`."""
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
    layout = (
        0,
        0,
        0,
        0,
        0,
        0,
    )  # NOPE, NG, ROPE_ROW, ROPE_OFF, SCALE_ROW, SCALE_OFF (in elements of each view)
    if fmt is not None:
        rs = fmt.rope_dtype.itemsize
        layout = (fmt.nope, fmt.num_scales, fmt.row_bytes // rs, fmt.rope_offset // rs, fmt.row_bytes // 4,
                  fmt.scale_offset // 4)  # fmt: skip
    n_slots = kv_slots.shape[1] + (cmp_slots.shape[1] if has_cmp else 0)
    cfg = dispatch.attention_config(T, H, D, n_slots, fp8=fmt is not None)
    grid = (T, triton.cdiv(H, cfg.block_h))
    _sparse_attn_kernel[grid](
        q, *_views(kv_pool, fmt), kv_slots, *_views(cmp_pool, fmt), cmp_slots, sinks.float().contiguous(), out,
        H, D, kv_slots.shape[1], cmp_slots.shape[1] if has_cmp else 0,
        q.stride(0), q.stride(1), kv_pool.stride(0), kv_slots.stride(0), cmp_pool.stride(0), cmp_slots.stride(0),
        out.stride(0), out.stride(1), scale * LOG2E, *layout,
        HAS_CMP=has_cmp, DOT_T=dot_dtype(q.dtype), BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_D=pow2(D, 16),
        FP8=fmt is not None, GROUP=GROUP, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
