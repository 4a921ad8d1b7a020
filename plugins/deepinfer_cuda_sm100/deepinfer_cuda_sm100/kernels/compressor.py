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
from deepinfer_cuda_sm100.kernels._common import TL_DTYPE, pdl_enter, pool_slot, pow2
from deepinfer_cuda_sm100.kernels.norm_rope import rope_row


@triton.jit
def _window_sum(kv_ptr, score_ptr, src_ptr, e, l_lo, l_hi, D, RATIO, stride_ke, stride_kl, stride_se, stride_sl,
                stride_src, OUT_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
                FROM_STATE: tl.constexpr, OVERLAP: tl.constexpr):  # fmt: skip
    """Online per-channel softmax over rows ``[l_lo, l_hi)`` of window ``e``: ``(max, sum, weighted sum)``."""
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    rows = tl.arange(0, BLOCK_L)
    m_i = tl.full([BLOCK_D], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for l0 in range(l_lo, l_hi, BLOCK_L):
        lm = l0 + rows < l_hi
        if FROM_STATE:
            slot = tl.load(src_ptr + e * stride_src + l0 + rows, mask=lm, other=-1)
            msk = (slot >= 0)[:, None] & dm[None, :]
            ch = d[None, :]
            if OVERLAP:
                ch = ch + tl.where(l0 + rows >= RATIO, D, 0)[:, None]
            off = slot[:, None] * stride_kl + ch
            s = tl.load(score_ptr + off, mask=msk, other=float("-inf"))
            v = tl.load(kv_ptr + off, mask=msk, other=0.0).to(OUT_T)
        else:
            msk = lm[:, None] & dm[None, :]
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
    return m_i, l_i, acc


@triton.jit
def _compress_part_kernel(
    kv_ptr, score_ptr, src_ptr, part_ptr, L, D, RATIO, CHUNK, stride_kl, stride_src,
    OUT_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, OVERLAP: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program ``(e, s)``: rows ``[s * CHUNK, (s + 1) * CHUNK)`` of window ``e`` (from the state pool) ->
    ``part[e, s] = (max, sum, weighted sum)`` per channel."""
    pdl_enter(PDL)
    e = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1) * CHUNK
    m_i, l_i, acc = _window_sum(kv_ptr, score_ptr, src_ptr, e, lo, tl.minimum(lo + CHUNK, L), D, RATIO, 0,
                                stride_kl, 0, 0, stride_src, OUT_T, BLOCK_L, BLOCK_D, True, OVERLAP)  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    base = part_ptr + (e * tl.num_programs(1) + tl.program_id(1)) * 3 * BLOCK_D + d
    tl.store(base, m_i)
    tl.store(base + BLOCK_D, l_i)
    tl.store(base + 2 * BLOCK_D, acc)


@triton.jit
def _compress_kernel(
    kv_ptr, score_ptr, w_ptr, pos_ptr, freq_ptr, out_ptr, src_ptr, out_slots_ptr, part_ptr,
    L, D, R2, RATIO, S_OUT, stride_ke, stride_kl, stride_se, stride_sl, stride_oe, stride_src, eps,
    BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, FROM_STATE: tl.constexpr, OVERLAP: tl.constexpr,
    OUT_SLOTS: tl.constexpr, PARTS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """``FROM_STATE``: row ``l`` of window ``e`` is state slot ``src[e, l]`` (``kv_ptr``/``score_ptr`` the kv and
    score halves of the state pool, ``stride_kl`` its row stride; with ``OVERLAP`` rows ``l >= RATIO`` read the
    second ``D`` channels), and its kv is rounded to the output dtype first, as the reference's cast does.
    ``OUT_SLOTS``: window ``e`` is written to row ``out_slots[e]`` of ``out`` (the entries pool).
    ``PARTS > 0``: the window's rows were summed in ``PARTS`` chunks by :func:`_compress_part_kernel`; merge."""
    pdl_enter(PDL)
    e = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    if PARTS > 0:
        m_i = tl.full([BLOCK_D], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_D], dtype=tl.float32)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for s in range(0, PARTS):
            base = part_ptr + (e * PARTS + s) * 3 * BLOCK_D + d
            m_s = tl.load(base)
            m_new = tl.maximum(m_i, m_s)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            a = tl.exp(m_i - m_ref)
            b = tl.exp(m_s - m_ref)
            l_i = l_i * a + tl.load(base + BLOCK_D) * b
            acc = acc * a + tl.load(base + 2 * BLOCK_D) * b
            m_i = m_new
    else:
        m_i, l_i, acc = _window_sum(kv_ptr, score_ptr, src_ptr, e, 0, L, D, RATIO, stride_ke, stride_kl, stride_se,
                                    stride_sl, stride_src, out_ptr.dtype.element_ty, BLOCK_L, BLOCK_D, FROM_STATE,
                                    OVERLAP)  # fmt: skip
    x = acc / tl.where(l_i > 0, l_i, 1.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    x = x * rstd * tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)
    x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
    y = rope_row(x, tl.load(pos_ptr + e).to(tl.float32), freq_ptr, D, R2, BLOCK_D)
    row = e
    if OUT_SLOTS:  # slot -1 (an entry that closes nothing in a static batch): the last, scratch slot
        row = pool_slot(out_slots_ptr, e, S_OUT)
    tl.store(out_ptr + row * stride_oe + d, y.to(out_ptr.dtype.element_ty), mask=dm)


@triton.jit
def _state_kernel(kv_ptr, gate_ptr, ape_ptr, pos_ptr, slots_ptr, state_ptr, C, RATIO, S, stride_kv, stride_g,
                  stride_state, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """``state[slot[t], 0] = kv[t]``, ``state[slot[t], 1] = gate[t] + ape[pos[t] % RATIO]``, in float32; slot
    ``-1`` (a padding row of a static batch) is the pool's last slot, the scratch block, as in torch."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    slot = pool_slot(slots_ptr, t, S)
    a = tl.load(ape_ptr + (tl.load(pos_ptr + t) % RATIO) * C + c, mask=cm, other=0.0)
    kv = tl.load(kv_ptr + t * stride_kv + c, mask=cm, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + t * stride_g + c, mask=cm, other=0.0).to(tl.float32)
    tl.store(state_ptr + slot * stride_state + c, kv, mask=cm)
    tl.store(state_ptr + slot * stride_state + C + c, g + a, mask=cm)


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
        kv, score, norm_weight.contiguous(), positions.contiguous(), inv_freq.float().contiguous(), out,
        positions, positions, out, L, D, inv_freq.numel(), 0, E, kv.stride(0), kv.stride(1), score.stride(0), score.stride(1),
        out.stride(0), 0, eps,
        BLOCK_L=cfg.block_l, BLOCK_D=pow2(D, 2), FROM_STATE=False, OVERLAP=False, OUT_SLOTS=False, PARTS=0,
        num_warps=cfg.num_warps, **dispatch.pdl_args(E),
    )  # fmt: skip
    return out


def compress_from_state(
    state: torch.Tensor,
    src_slots: torch.Tensor,
    overlap: bool,
    norm_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    out: torch.Tensor,
    out_slots: torch.Tensor | None,
    splits: int | None = None,
) -> None:
    """One launch of :meth:`AttentionOps.compress_into`'s gather + compress: windows read straight from the
    state pool ``[S, 2, C]``; written to ``out[out_slots]`` (the entries pool) or to ``out [E, D]``. Long
    windows of few entries (HCA at decode: 128 rows, one program) are first summed in ``splits`` chunks
    (default :func:`dispatch.compress_splits`), one program each: two launches."""
    E, L = src_slots.shape
    if E == 0:
        return
    C = state.shape[-1]
    D = C // 2 if overlap else C
    state, src_slots = state.contiguous(), src_slots.contiguous()
    cfg = dispatch.compress_config(L, D)
    splits = dispatch.compress_splits(E, L, cfg.block_l) if splits is None else splits
    chunk = triton.cdiv(triton.cdiv(L, max(splits, 1)), cfg.block_l) * cfg.block_l
    parts = triton.cdiv(L, chunk) if splits > 1 else 0
    bd, ratio = pow2(D, 2), L // 2 if overlap else L
    part = out
    if parts:
        part = torch.empty((E, parts, 3, bd), dtype=torch.float32, device=state.device)
        _compress_part_kernel[(E, parts)](
            state, state[:, 1], src_slots, part, L, D, ratio, chunk, state.stride(0), src_slots.stride(0),
            OUT_T=TL_DTYPE[out.dtype], BLOCK_L=cfg.block_l, BLOCK_D=bd, OVERLAP=overlap, num_warps=cfg.num_warps,
            **dispatch.pdl_args(E),
        )  # fmt: skip
    slots = out_slots.contiguous() if out_slots is not None else src_slots
    _compress_kernel[(E,)](
        state, state[:, 1], norm_weight.contiguous(), positions.contiguous(), inv_freq.float().contiguous(),
        out, src_slots, slots, part, L, D, inv_freq.numel(), ratio, out.shape[0], 0, state.stride(0), 0, 0,
        out.stride(0), src_slots.stride(0), eps,
        BLOCK_L=cfg.block_l, BLOCK_D=bd, FROM_STATE=True, OVERLAP=overlap, OUT_SLOTS=out_slots is not None,
        PARTS=parts, num_warps=cfg.num_warps, **dispatch.pdl_args(E),
    )  # fmt: skip


def write_state(state, slots, kv, gate, ape, positions) -> None:
    """See :meth:`AttentionOps.write_compressor_state`: one launch."""
    T, C = kv.shape
    if T == 0:
        return
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    bc = min(1024, pow2(C, 16))
    _state_kernel[(T, triton.cdiv(C, bc))](
        kv, gate, ape.float().contiguous(), positions.contiguous(), slots.contiguous(), state, C, ape.shape[0],
        state.shape[0], kv.stride(0), gate.stride(0), state.stride(0), BLOCK_C=bc, num_warps=4,
        **dispatch.pdl_args(T),
    )  # fmt: skip
