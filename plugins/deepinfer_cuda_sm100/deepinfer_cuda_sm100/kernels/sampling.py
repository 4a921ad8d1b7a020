"""Sampling kernels over ``[B, V]`` logits.

- Penalties (vLLM semantics) and the grammar bitmask: element-wise, one read and one write of the
  logits (the torch versions make 4-6 passes and materialise ``[B, V]`` temporaries). Grid
  ``(B, cdiv(V, BLOCK_V))``.
- ``probs``: temperature, top-k, softmax, top-p and min-p in one program per row, with no sort. Each cut
  is a threshold found by bisection over the row (passes over ``V`` in ``BLOCK_V`` chunks, re-read from
  L2): top-k on the logits' order-preserving integer image (ties at the k-th value kept), top-p on the
  probabilities' (the token order of a stable descending sort: equal probabilities by token id, so a
  partly kept tie group keeps its lowest ids, found by a bisection on the id), min-p directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch


@triton.jit
def _penalties_kernel(logits_ptr, mask_ptr, counts_ptr, pres_ptr, freq_ptr, rep_ptr, out_ptr, V,
                      stride_l, stride_m, stride_c, stride_o, BLOCK_V: tl.constexpr):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    vm = v < V
    x = tl.load(logits_ptr + b * stride_l + v, mask=vm, other=0.0).to(tl.float32)
    in_prompt = tl.load(mask_ptr + b * stride_m + v, mask=vm, other=0) != 0
    cnt = tl.load(counts_ptr + b * stride_c + v, mask=vm, other=0).to(tl.float32)
    rep = tl.load(rep_ptr + b)
    seen = in_prompt | (cnt > 0)
    x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
    x = x - tl.load(freq_ptr + b) * cnt - tl.load(pres_ptr + b) * (cnt > 0).to(tl.float32)
    tl.store(out_ptr + b * stride_o + v, x, mask=vm)


def apply_penalties(logits, prompt_mask, output_counts, presence, frequency, repetition) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.sampling.SamplingOps.apply_penalties`."""
    B, V = logits.shape
    out = torch.empty((B, V), dtype=torch.float32, device=logits.device)
    if B == 0:
        return out
    logits = logits.contiguous()
    mask = (
        prompt_mask.contiguous().view(torch.uint8)
        if prompt_mask.dtype == torch.bool
        else prompt_mask.contiguous()
    )
    counts = output_counts.contiguous()
    cfg = dispatch.vocab_config(V)
    _penalties_kernel[(B, triton.cdiv(V, cfg.block_v))](
        logits, mask, counts, presence.float().contiguous(), frequency.float().contiguous(),
        repetition.float().contiguous(), out, V, logits.stride(0), mask.stride(0), counts.stride(0), out.stride(0),
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


@triton.jit
def _bitmask_kernel(logits_ptr, mask_ptr, out_ptr, V, stride_l, stride_m, stride_o, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    vm = v < V
    x = tl.load(logits_ptr + b * stride_l + v, mask=vm, other=0.0)
    word = tl.load(mask_ptr + b * stride_m + v // 32, mask=vm, other=0)
    allowed = ((word >> (v % 32)) & 1) != 0
    tl.store(out_ptr + b * stride_o + v, tl.where(allowed, x, float("-inf")), mask=vm)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.sampling.SamplingOps.apply_bitmask`."""
    B, V = logits.shape
    out = torch.empty_like(logits, memory_format=torch.contiguous_format)
    if B == 0:
        return out
    logits, bitmask = logits.contiguous(), bitmask.contiguous()
    cfg = dispatch.vocab_config(V)
    _bitmask_kernel[(B, triton.cdiv(V, cfg.block_v))](
        logits, bitmask, out, V, logits.stride(0), bitmask.stride(0), out.stride(0),
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


@triton.jit
def _key(x):
    """float32 -> int32 with the same order (negative floats' magnitude bits reversed)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _row_x(row_ptr, v, vm, temp):
    return tl.load(row_ptr + v, mask=vm, other=float("-inf")).to(tl.float32) / temp


@triton.jit
def _count_ge(row_ptr, V, temp, t, BLOCK_V: tl.constexpr):
    """How many of the row's ``x`` have ``_key(x) >= t``."""
    c = 0
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vm = v < V
        c += tl.sum(((_key(_row_x(row_ptr, v, vm, temp)) >= t) & vm).to(tl.int32))
    return c


@triton.jit
def _kept_p(row_ptr, v, vm, temp, t_k, mx, z1):
    """The row's probabilities after top-k (0 for cut tokens) and their ``_key``."""
    x = _row_x(row_ptr, v, vm, temp)
    p = tl.where(vm & (_key(x) >= t_k), tl.exp(x - mx) / z1, 0.0)
    return p, _key(p)


@triton.jit
def _mass_above(row_ptr, V, temp, t_k, mx, z1, t, BLOCK_V: tl.constexpr):
    """Sum of the probabilities with ``_key(p) > t``."""
    s = 0.0
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vm = v < V
        p, kp = _kept_p(row_ptr, v, vm, temp, t_k, mx, z1)
        s += tl.sum(tl.where(kp > t, p, 0.0))
    return s


@triton.jit
def _count_group_below(row_ptr, V, temp, t_k, mx, z1, t_p, idx, BLOCK_V: tl.constexpr):
    """Tokens with ``_key(p) == t_p`` and id below ``idx``."""
    c = 0
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vm = v < V
        p, kp = _kept_p(row_ptr, v, vm, temp, t_k, mx, z1)
        c += tl.sum(((kp == t_p) & (v < idx) & vm).to(tl.int32))
    return c


@triton.jit
def _probs_kernel(logits_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr, out_ptr, V, stride_l, stride_o,
                  BLOCK_V: tl.constexpr):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    row = logits_ptr + b * stride_l
    out = out_ptr + b * stride_o
    t_raw = tl.load(temp_ptr + b)
    greedy = t_raw <= 0
    temp = tl.where(greedy, 1.0, t_raw)
    # pass 1: the maximum and its lowest id (greedy rows: one-hot there)
    mx = float("-inf")
    arg = V
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vm = v < V
        x = _row_x(row, v, vm, temp)
        bm = tl.max(x)
        barg = tl.min(tl.where((x == bm) & vm, v, V))
        arg = tl.where(bm > mx, barg, arg)
        mx = tl.maximum(mx, bm)
    # top-k: the largest key t_k with at least k keys >= t_k is the k-th largest value's
    k = tl.load(topk_ptr + b)
    k = tl.where(k > 0, tl.minimum(k, V), V)
    lo = tl.full((), -(2**31), tl.int64)
    hi = tl.where((k < V) & (t_raw > 0), 2**31 - 1, -(2**31))  # k = V or greedy: no cut
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        ok = _count_ge(row, V, temp, mid.to(tl.int32), BLOCK_V) >= k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    t_k = lo.to(tl.int32)
    z1 = 0.0
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vm = v < V
        x = _row_x(row, v, vm, temp)
        z1 += tl.sum(tl.where(vm & (_key(x) >= t_k), tl.exp(x - mx), 0.0))
    # top-p: the smallest key t_p whose strictly-larger probability mass is below top_p; its tie group
    # keeps its lowest ids while the running mass stays below top_p
    top_p = tl.load(topp_ptr + b)
    p_max = 1.0 / z1
    t_p = tl.full((), -1, tl.int64)  # below every key: keep all
    idx_cut = V
    if (top_p < 1) & (t_raw > 0):
        lo2 = tl.full((), 0, tl.int64)
        hi2 = _key(p_max).to(tl.int64)
        while lo2 < hi2:
            mid = (lo2 + hi2) // 2
            below = _mass_above(row, V, temp, t_k, mx, z1, mid.to(tl.int32), BLOCK_V) < top_p
            hi2 = tl.where(below, mid, hi2)
            lo2 = tl.where(below, lo2, mid + 1)
        g = _mass_above(row, V, temp, t_k, mx, z1, lo2.to(tl.int32), BLOCK_V)
        v_c = lo2.to(tl.int32).to(tl.float32, bitcast=True)
        if lo2 > 0:  # else the whole kept mass is below top_p: keep all
            t_p = lo2
            m = tl.ceil((top_p - g) / v_c).to(tl.int32)
            lo3 = tl.full((), 0, tl.int32)
            hi3 = tl.full((), 0, tl.int32) + V
            while lo3 < hi3:  # the smallest id bound holding m tokens of the group (ids are distinct)
                mid = (lo3 + hi3) // 2
                enough = _count_group_below(row, V, temp, t_k, mx, z1, lo2.to(tl.int32), mid, BLOCK_V) >= m
                hi3 = tl.where(enough, mid, hi3)
                lo3 = tl.where(enough, lo3, mid + 1)
            idx_cut = lo3
    # min-p on the kept set, then the normalisation (p_max is always kept)
    min_p = tl.load(minp_ptr + b)
    t_p32 = t_p.to(tl.int32)
    z3 = 0.0
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vm = v < V
        p, kp = _kept_p(row, v, vm, temp, t_k, mx, z1)
        keep = (kp > t_p32) | ((kp == t_p32) & (v < idx_cut))
        keep = keep & (p >= min_p * p_max) & (p > 0)
        z3 += tl.sum(tl.where(keep, p, 0.0))
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        vm = v < V
        p, kp = _kept_p(row, v, vm, temp, t_k, mx, z1)
        keep = (kp > t_p32) | ((kp == t_p32) & (v < idx_cut))
        keep = keep & (p >= min_p * p_max) & (p > 0)
        res = tl.where(keep, p / z3, 0.0)
        res = tl.where(greedy, tl.where(v == arg, 1.0, 0.0), res)
        tl.store(out + v, res, mask=vm)


def probs(logits: torch.Tensor, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.sampling.SamplingOps.probs` (float32 ``[B, V]``)."""
    B, V = logits.shape
    out = torch.empty((B, V), dtype=torch.float32, device=logits.device)
    if B == 0:
        return out
    logits = logits.contiguous()
    cfg = dispatch.probs_config(V)
    _probs_kernel[(B,)](
        logits, temperature.float().contiguous(), top_k.long().contiguous(), top_p.float().contiguous(),
        min_p.float().contiguous(), out, V, logits.stride(0), out.stride(0),
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps,
    )  # fmt: skip
    return out
