"""Lightning-indexer scoring: ``score[t, c] = sum_h w[t, h] * relu(q[t, h] . key[cand[t, c]])``.

Grid ``(T, splits)``: each program keeps one token's ``[Hi, Di]`` query tile on chip and walks every
``splits``-th block of ``BLOCK_C`` candidates, gathering keys by slot id. Invalid candidates score
``-inf``. Selection (:func:`indexer_topk`) is ``torch.topk`` over the scores, or ``_topk_select_kernel``
where :func:`dispatch.indexer_select` picks it: one program per token finds the k-th largest score by
bisection on the scores' order-preserving integer image (stopping at the first midpoint with exactly ``k``
keys at or above it) and writes the chosen columns by prefix sums, no sort.

DeepSeek-V4.1's FP4 index keys (e2m1 codes with a ue8m0 scale per 32, ``deepinfer_core.kv.packed``) are decoded
in the scoring kernel as they are gathered (``KEY_PACK``, the attention kernel's ``_load_packed``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import dot_dtype, mma, pdl_enter, pow2
from deepinfer_cuda_sm100.kernels.sparse_attention import _load_packed, packed_layout


@triton.jit
def _indexer_score_kernel(
    q_ptr, w_ptr, key_ptr, cand_ptr, out_ptr,
    Hi, Di, C, stride_qt, stride_qh, stride_wt, stride_key, stride_ct, stride_ot, w_scale,
    DOT_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
    KEY_PACK: tl.constexpr = 0, KEY_CODE: tl.constexpr = 0, KEY_SB: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """``KEY_PACK`` 3: ``key_ptr`` is a byte pool of V4.1's FP4 index keys (e2m1 + ue8m0 per ``KEY_SB``)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hm = h < Hi
    dm = d < Di
    q = tl.load(
        q_ptr + t * stride_qt + h[:, None] * stride_qh + d[None, :], mask=hm[:, None] & dm[None, :], other=0.0
    )
    q = q.to(DOT_T)
    w = tl.load(w_ptr + t * stride_wt + h, mask=hm, other=0.0).to(tl.float32) * w_scale
    cols = tl.arange(0, BLOCK_C)
    for c0 in range(split * BLOCK_C, C, n_split * BLOCK_C):
        cm = c0 + cols < C
        slot = tl.load(cand_ptr + t * stride_ct + c0 + cols, mask=cm, other=-1)
        valid = slot >= 0
        if KEY_PACK > 0:
            k = _load_packed(key_ptr, key_ptr, slot, valid, d, dm, stride_key, KEY_PACK, KEY_CODE, KEY_SB)
        else:
            k = tl.load(
                key_ptr + slot[:, None] * stride_key + d[None, :],
                mask=valid[:, None] & dm[None, :],
                other=0.0,
            )
        s = mma(k.to(DOT_T), tl.trans(q), None, DOT_T)
        score = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
        score = tl.where(valid, score, float("-inf"))
        tl.store(out_ptr + t * stride_ot + c0 + cols, score, mask=cm)


def indexer_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_pool: torch.Tensor,
    cand_slots: torch.Tensor,
    w_scale: float = 1.0,
    key_format=None,
) -> torch.Tensor:
    """``[T, C]`` float32 scores with ``weights.float() * w_scale``, ``-inf`` for invalid candidates. ``key_format``:
    V4.1's FP4 index keys (:func:`key_pack`), decoded in the kernel."""
    T, Hi, Di = q.shape
    C = cand_slots.shape[1]
    out = torch.empty((T, C), dtype=torch.float32, device=q.device)
    if T == 0 or C == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    key_pool = key_pool if key_pool.stride(-1) == 1 else key_pool.contiguous()
    cand_slots = cand_slots.contiguous()
    weights = weights.contiguous()
    cfg = dispatch.indexer_config(T, Hi, Di, C)
    pack = key_pack(key_format, Di) if key_format is not None else (0, 0, 1)
    if pack is None:
        raise ValueError(f"the scoring kernel does not decode {key_format}: see key_pack")
    _indexer_score_kernel[(T, cfg.splits)](
        q, weights, key_pool, cand_slots, out,
        Hi, Di, C, q.stride(0), q.stride(1), weights.stride(0), key_pool.stride(0), cand_slots.stride(0), out.stride(0),
        float(w_scale), DOT_T=dot_dtype(q.dtype), BLOCK_H=pow2(Hi, 16), BLOCK_D=pow2(Di, 16), BLOCK_C=cfg.block_c,
        KEY_PACK=pack[0], KEY_CODE=pack[1], KEY_SB=pack[2], num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **dispatch.pdl_args(T),
    )  # fmt: skip
    return out


def key_pack(key_format, d: int) -> tuple[int, int, int] | None:
    """The kernel's ``(KEY_PACK, code bytes, values per scale)`` for a V4.1 key codec: e2m1 codes with ue8m0
    scales (what V4.1's index keys are; the kernel reads the pool as bytes only), else None."""
    pack = packed_layout(key_format, d)
    return pack if pack is not None and pack[0] == 3 else None


@triton.jit
def _topk_select_kernel(
    score_ptr, cand_ptr, out_ptr, C, K, stride_s, stride_c, stride_o, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
    SLOTS: tl.constexpr, RADIX: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """Row ``t``: the columns of its ``K`` largest finite scores (any order; ``SLOTS``: their ``cand`` slot ids),
    then ``-1`` past the valid ones. The threshold, the ``K``-th largest key, by bisection (each step a count over
    the row; it stops at the first midpoint with exactly ``K`` keys at or above it, about 15 steps for a few
    thousand random scores instead of 33), or with ``RADIX`` by four 8-bit digit histograms (``tl.histogram``), most
    significant first, each over the keys that share the digits found so far."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    s = tl.load(score_ptr + t * stride_s + c, mask=c < C, other=float("-inf"))
    valid = s > float("-inf")
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)  # larger float, larger integer
    # Largest threshold with at least K keys at or above it (the smallest valid key if fewer are valid).
    lo = tl.min(tl.where(valid, key, 1 << 40))
    if RADIX:
        u = key + (1 << 31)  # the keys as unsigned 32-bit values, order kept
        b = tl.arange(0, 256)
        need = K
        prefix = tl.zeros([], dtype=tl.int64)
        for shift in tl.static_range(24, -1, -8):
            if shift == 24:
                active = valid
            else:
                active = valid & ((u >> (shift + 8)) == (prefix >> (shift + 8)))
            h = tl.histogram(((u >> shift) & 255).to(tl.int32), 256, mask=active)
            at_or_above = tl.sum(h, 0) - tl.cumsum(h, 0) + h  # keys (of the active) with this digit or larger
            digit = tl.max(tl.where(at_or_above >= need, b, 0))
            need = need - tl.sum(tl.where(b > digit, h, 0), 0)
            prefix = prefix | (digit.to(tl.int64) << shift)
        lo = tl.where(tl.sum(valid.to(tl.int32)) > K, prefix - (1 << 31), lo)
    else:
        hi = tl.max(tl.where(valid, key, -(1 << 40)))
        going = tl.sum(valid.to(tl.int32)) > K  # else every valid key is chosen: lo stays the smallest
        while (lo < hi) & going:
            mid = lo + (hi - lo + 1) // 2
            count = tl.sum((valid & (key >= mid)).to(tl.int32))
            going = count != K  # exactly K keys at or above mid: they are the K largest, stop
            lo = tl.where(count >= K, mid, lo)
            hi = tl.where(count >= K, hi, mid - 1)
        lo = tl.min(tl.where(valid & (key >= lo), key, 1 << 40))  # the K-th largest key itself
    above = valid & (key > lo)
    tie = valid & (key == lo)
    n_above = tl.sum(above.to(tl.int32))
    pos = tl.where(above, tl.cumsum(above.to(tl.int32), 0) - 1, n_above + tl.cumsum(tie.to(tl.int32), 0) - 1)
    chosen_mask = above | (tie & (pos < K))
    if SLOTS:
        val = tl.load(cand_ptr + t * stride_c + c, mask=chosen_mask & (c < C), other=-1).to(tl.int64)
    else:
        val = c.to(tl.int64)
    tl.store(out_ptr + t * stride_o + pos, val, mask=chosen_mask)
    chosen = tl.minimum(tl.sum(valid.to(tl.int32)), K)
    j = tl.arange(0, BLOCK_K)
    tl.store(out_ptr + t * stride_o + j, tl.full([BLOCK_K], -1, tl.int64), mask=(j >= chosen) & (j < K))


def select_topk(scores: torch.Tensor, k: int, cand_slots: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, k]`` columns of each row's ``k`` largest finite scores (any order; with ``cand_slots``, the slot
    ids at those columns), ``-1`` past the valid ones."""
    T, C = scores.shape
    out = torch.empty((T, k), dtype=torch.int64, device=scores.device)
    if T and k:
        cfg = dispatch.select_config(C)
        cand = cand_slots if cand_slots is not None else scores
        _topk_select_kernel[(T,)](
            scores, cand, out, C, k, scores.stride(0), cand.stride(0), out.stride(0), BLOCK_C=pow2(C, 16),
            BLOCK_K=pow2(k, 16), SLOTS=cand_slots is not None, RADIX=cfg.radix, num_warps=cfg.num_warps,
            **dispatch.pdl_args(T),
        )  # fmt: skip
    return out


def indexer_select(
    q: torch.Tensor, weights: torch.Tensor, w_scale: float, key_pool: torch.Tensor, cand_slots: torch.Tensor,
    topk: int,
) -> torch.Tensor:  # fmt: skip
    """Slot ids of the ``min(topk, C)`` best scores (``weights`` scaled in the scoring kernel, columns mapped
    to slots in the select kernel), ``-1`` past the valid ones."""
    return _best(indexer_scores(q, weights, key_pool, cand_slots, w_scale), cand_slots, topk, slots=True)


def indexer_topk(
    q: torch.Tensor, weights: torch.Tensor, key_pool: torch.Tensor, cand_slots: torch.Tensor, topk: int
) -> torch.Tensor:
    """Column indices into ``cand_slots`` of the ``min(topk, C)`` best scores, ``-1`` past the valid ones."""
    return _best(indexer_scores(q, weights, key_pool, cand_slots), cand_slots, topk, slots=False)


def best_columns(scores: torch.Tensor, cand_slots: torch.Tensor, topk: int) -> torch.Tensor:
    """Column indices of the ``min(topk, C)`` best of any ``scores [T, C]`` (``-inf``: not a candidate), ``-1``
    past the valid ones."""
    return _best(scores, cand_slots, topk, slots=False)


def best_slots(scores: torch.Tensor, cand_slots: torch.Tensor, topk: int) -> torch.Tensor:
    """:func:`best_columns`' choice as ``cand_slots`` ids (mapped in the select kernel), in the same order."""
    return _best(scores, cand_slots, topk, slots=True)


def _best(scores: torch.Tensor, cand_slots: torch.Tensor, topk: int, slots: bool) -> torch.Tensor:
    """The ``min(topk, C)`` best columns of ``scores`` (``slots``: their ``cand_slots`` ids), by the select
    kernel or ``torch.topk`` as :func:`dispatch.indexer_select` picks; ``-1`` past the valid ones."""
    k = min(topk, cand_slots.shape[1])
    if dispatch.indexer_select(scores.shape[1]) == "kernel":
        return select_topk(scores, k, cand_slots.contiguous() if slots else None)
    val, idx = torch.topk(scores, k, dim=1, sorted=False)
    chosen = cand_slots.gather(1, idx) if slots else idx
    return torch.where(torch.isneginf(val), torch.full_like(idx, -1), chosen)
