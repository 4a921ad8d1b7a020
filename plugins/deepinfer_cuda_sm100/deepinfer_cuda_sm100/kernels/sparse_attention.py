"""Sparse shared-KV attention with a learned sink per head, over slot indices.

One program handles one query token and ``BLOCK_H`` heads: it gathers ``BLOCK_N`` KV rows at a time
by slot id (K = V, one KV head shared by all query heads) and runs an online softmax in base 2.
The sink enters as the softmax's starting point (running max = sink, running sum = 1), so a row
whose slots are all padding returns zeros without a special case. Window slots and compressed
slots are two loops over two pools that feed the same running state. Decode and prefill are the
same kernel: every query token carries its own slot lists.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import dot_dtype, mma, pow2

LOG2E = 1.4426950408889634


@triton.jit
def _attend(q, pool_ptr, slots_ptr, n_slots, stride_pool, d, dmask, m_i, l_i, acc, qk_scale,
            DOT_T: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    for n0 in range(0, n_slots, BLOCK_N):
        slot = tl.load(slots_ptr + n0 + cols, mask=n0 + cols < n_slots, other=-1)
        valid = slot >= 0
        k = tl.load(
            pool_ptr + slot[:, None] * stride_pool + d[None, :],
            mask=valid[:, None] & dmask[None, :],
            other=0.0,
        )
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
    q_ptr, kv_ptr, kv_slots_ptr, cmp_ptr, cmp_slots_ptr, sinks_ptr, out_ptr,
    H, D, n_kv, n_cmp,
    stride_qt, stride_qh, stride_kv, stride_kvs, stride_cmp, stride_cmps, stride_ot, stride_oh,
    qk_scale,
    HAS_CMP: tl.constexpr, DOT_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
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
    m_i, l_i, acc = _attend(q, kv_ptr, kv_slots_ptr + t * stride_kvs, n_kv, stride_kv, d, dm, m_i, l_i, acc, qk_scale,
                            DOT_T, BLOCK_N)  # fmt: skip
    if HAS_CMP:
        m_i, l_i, acc = _attend(q, cmp_ptr, cmp_slots_ptr + t * stride_cmps, n_cmp, stride_cmp, d, dm, m_i, l_i, acc,
                                qk_scale, DOT_T, BLOCK_N)  # fmt: skip
    out = acc / l_i[:, None]
    tl.store(out_ptr + t * stride_ot + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=hm[:, None] & dm[None, :])  # fmt: skip


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def sparse_attention(
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_slots: torch.Tensor,
    cmp_pool: torch.Tensor | None,
    cmp_slots: torch.Tensor | None,
    sinks: torch.Tensor,
    scale: float,
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
    cfg = dispatch.attention_config(T, H, D, kv_slots.shape[1] + (cmp_slots.shape[1] if has_cmp else 0))
    grid = (T, triton.cdiv(H, cfg.block_h))
    _sparse_attn_kernel[grid](
        q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks.float().contiguous(), out,
        H, D, kv_slots.shape[1], cmp_slots.shape[1] if has_cmp else 0,
        q.stride(0), q.stride(1), kv_pool.stride(0), kv_slots.stride(0), cmp_pool.stride(0), cmp_slots.stride(0),
        out.stride(0), out.stride(1), scale * LOG2E,
        HAS_CMP=has_cmp, DOT_T=dot_dtype(q.dtype), BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_D=pow2(D, 16),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
