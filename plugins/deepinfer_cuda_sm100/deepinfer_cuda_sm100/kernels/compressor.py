"""Compressor: per-channel softmax-weighted sum over a window, then RMSNorm, then interleaved RoPE.

One program owns one closed window ``e`` and the whole ``D``-wide row, so the RMSNorm reduction and
the RoPE pairing stay in registers: ``L`` source rows stream through in ``BLOCK_L`` chunks with an
online softmax per channel (``-inf`` scores mark empty slots), and the normalised, rotated row is
written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pow2


@triton.jit
def _compress_kernel(
    kv_ptr, score_ptr, w_ptr, pos_ptr, freq_ptr, out_ptr,
    L, D, R2, stride_ke, stride_kl, stride_se, stride_sl, stride_oe, eps,
    BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    e = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    rows = tl.arange(0, BLOCK_L)
    m_i = tl.full([BLOCK_D], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for l0 in range(0, L, BLOCK_L):
        msk = (l0 + rows < L)[:, None] & dm[None, :]
        s = tl.load(
            score_ptr + e * stride_se + (l0 + rows)[:, None] * stride_sl + d[None, :],
            mask=msk,
            other=float("-inf"),
        )
        v = tl.load(
            kv_ptr + e * stride_ke + (l0 + rows)[:, None] * stride_kl + d[None, :], mask=msk, other=0.0
        )
        m_new = tl.maximum(m_i, tl.max(s.to(tl.float32), axis=0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s.to(tl.float32) - m_ref[None, :])
        alpha = tl.exp(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p * v.to(tl.float32), axis=0)
        m_i = m_new
    x = acc / tl.where(l_i > 0, l_i, 1.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    x = x * rstd * tl.load(w_ptr + d, mask=dm, other=0.0)
    x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
    # Interleaved RoPE on the trailing 2*R2 channels: pair (2i, 2i+1) of the row.
    ev, od = tl.split(tl.reshape(x, (BLOCK_D // 2, 2)))
    i = tl.arange(0, BLOCK_D // 2)
    f = i - (D // 2 - R2)
    rot = (f >= 0) & (f < R2)
    ang = tl.load(pos_ptr + e).to(tl.float32) * tl.load(freq_ptr + f, mask=rot, other=0.0)
    c = tl.where(rot, tl.cos(ang), 1.0)
    s_ = tl.where(rot, tl.sin(ang), 0.0)
    y = tl.reshape(tl.join(ev * c - od * s_, ev * s_ + od * c), (BLOCK_D,))
    tl.store(out_ptr + e * stride_oe + d, y.to(out_ptr.dtype.element_ty), mask=dm)


def compress(
    kv: torch.Tensor,
    score: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.attention.AttentionOps.compress`."""
    E, L, D = kv.shape
    out = torch.empty((E, D), dtype=kv.dtype, device=kv.device)
    if E == 0:
        return out
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    score = score if score.stride(-1) == 1 else score.contiguous()
    cfg = dispatch.compress_config(L, D)
    _compress_kernel[(E,)](
        kv, score, norm_weight.float().contiguous(), positions.contiguous(), inv_freq.float().contiguous(), out,
        L, D, inv_freq.numel(), kv.stride(0), kv.stride(1), score.stride(0), score.stride(1), out.stride(0), eps,
        BLOCK_L=cfg.block_l, BLOCK_D=pow2(D, 2), num_warps=cfg.num_warps,
    )  # fmt: skip
    return out
