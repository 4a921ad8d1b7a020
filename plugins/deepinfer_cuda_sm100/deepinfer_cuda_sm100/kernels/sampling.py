"""Passes over ``[B, V]``: vLLM-semantics penalties and the grammar bitmask, and the keyed draw of a token.

The penalties and the bitmask read the logits once and write them once (the torch versions of the same
expressions make 4-6 passes and materialise ``[B, V]`` temporaries), grid ``(B, cdiv(V, BLOCK_V))``.
The draw computes the core's keyed uniform (``deepinfer_core.ops.draws``) in registers and inverts the row's running
sum, each row split over chunks: a whole batch draws in two launches (a ``torch.Generator`` a row was one launch
a row).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.plugin_api import draws
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter


@triton.jit
def _penalties_kernel(logits_ptr, mask_ptr, counts_ptr, pres_ptr, freq_ptr, rep_ptr, out_ptr, V,
                      stride_l, stride_m, stride_c, stride_o, BLOCK_V: tl.constexpr,
                      PDL: tl.constexpr = False):  # fmt: skip
    pdl_enter(PDL)
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
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps, **dispatch.pdl_args(B),
    )  # fmt: skip
    return out


@triton.jit
def _bitmask_kernel(
    logits_ptr, mask_ptr, out_ptr, V, stride_l, stride_m, stride_o, BLOCK_V: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
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
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps, **dispatch.pdl_args(B),
    )  # fmt: skip
    return out


@triton.jit
def _mix(x, M1: tl.constexpr, M2: tl.constexpr):
    """lowbias32 on uint32 (wrapping multiplies): the core's ``draws.mix``."""
    x = x ^ (x >> 16)
    x = x * tl.full([], M1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], M2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _row_key(seed, pos, STREAM: tl.constexpr, K0: tl.constexpr, K1: tl.constexpr, M1: tl.constexpr,
             M2: tl.constexpr):  # fmt: skip
    """``draws.keys``: ``seed``, ``pos`` non-negative int64."""
    k = _mix((seed & 0xFFFFFFFF).to(tl.uint32) ^ tl.full([], K0, tl.uint32), M1, M2)
    k = _mix(k ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32), M1, M2)
    k = _mix(k ^ (pos & 0xFFFFFFFF).to(tl.uint32), M1, M2)
    hi = ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32) + tl.full([], (STREAM * K1) & 0xFFFFFFFF, tl.uint32)
    return _mix(k ^ hi, M1, M2)


@triton.jit
def _uniform(key):
    """``draws.uniforms`` of a 32-bit key: ``(key + 0.5) * 2**-32`` in float64."""
    return (key.to(tl.float64) + 0.5) * 2.3283064365386963e-10


@triton.jit
def _draw_rows_kernel(p_ptr, seeds_ptr, pos_ptr, out_ptr, B, V, stride_p, STREAM: tl.constexpr, K0: tl.constexpr,
                      K1: tl.constexpr, M1: tl.constexpr, M2: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_V: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Rows of at most ``BLOCK_V`` tokens, ``BLOCK_R`` rows a program: ``draws.draw``, the inverse of each row's
    float64 running sum at its keyed uniform (the last token of positive weight should rounding put ``x`` past
    every sum; a row of zeros draws 0)."""
    pdl_enter(PDL)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = rows < B
    v = tl.arange(0, BLOCK_V)
    m = rm[:, None] & (v < V)[None, :]
    w = tl.load(p_ptr + rows[:, None] * stride_p + v[None, :], mask=m, other=0.0).to(tl.float64)
    key = _row_key(tl.load(seeds_ptr + rows, mask=rm, other=0), tl.load(pos_ptr + rows, mask=rm, other=0), STREAM,
                   K0, K1, M1, M2)  # fmt: skip
    c = tl.cumsum(w, axis=1)
    x = _uniform(key) * tl.max(c, axis=1)  # uniform (2**-32) times the total
    n = tl.sum((m & (c <= x[:, None])).to(tl.int32), axis=1)
    last = tl.max(tl.where(w > 0, v[None, :], 0), axis=1)
    tl.store(out_ptr + rows, tl.minimum(n, last).to(tl.int64), mask=rm)


DRAW_CHUNK = 4096  # tokens a program of the draw reads


@triton.jit
def _chunk_sums_kernel(
    p_ptr, sums_ptr, last_ptr, V, C, stride_p, CHUNK: tl.constexpr, PDL: tl.constexpr = False
):
    """Grid ``(B, C)``: chunk ``c`` of row ``b``, its weights' float64 sum and its last token of positive weight
    (-1: none)."""
    pdl_enter(PDL)
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    v = c * CHUNK + tl.arange(0, CHUNK)
    w = tl.load(p_ptr + b * stride_p + v, mask=v < V, other=0.0).to(tl.float64)
    tl.store(sums_ptr + b * C + c, tl.sum(w, axis=0))
    tl.store(last_ptr + b * C + c, tl.max(tl.where(w > 0, v, -1), axis=0))


@triton.jit
def _draw_chunk_kernel(p_ptr, sums_ptr, last_ptr, seeds_ptr, pos_ptr, out_ptr, V, C, stride_p, STREAM: tl.constexpr,
                       K0: tl.constexpr, K1: tl.constexpr, M1: tl.constexpr, M2: tl.constexpr, CHUNK: tl.constexpr,
                       C_POW2: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: every chunk scans the row's chunk sums the same way, so the chunks' intervals
    ``[excl, incl)`` tile ``[0, total)`` exactly; the one whose interval holds ``x = uniform * total`` inverts its
    own running sum from ``excl`` (and stays on its last positive weight should rounding inside the chunk run
    past ``x``). A row of zeros: chunk 0 writes token 0."""
    pdl_enter(PDL)
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i = tl.arange(0, C_POW2)
    s = tl.load(sums_ptr + b * C + i, mask=i < C, other=0.0)
    incl = tl.cumsum(s, axis=0)
    total = tl.max(incl, axis=0)
    hi = tl.sum(tl.where(i == c, incl, 0.0), axis=0)
    lo = tl.sum(tl.where(i == c - 1, incl, 0.0), axis=0)
    key = _row_key(tl.load(seeds_ptr + b), tl.load(pos_ptr + b), STREAM, K0, K1, M1, M2)
    x = _uniform(key) * total
    if (lo <= x) & (x < hi):
        v = c * CHUNK + tl.arange(0, CHUNK)
        w = tl.load(p_ptr + b * stride_p + v, mask=v < V, other=0.0).to(tl.float64)
        n = tl.sum(((lo + tl.cumsum(w, axis=0)) <= x).to(tl.int32), axis=0)
        tl.store(out_ptr + b, tl.minimum(c * CHUNK + n, tl.load(last_ptr + b * C + c)).to(tl.int64))
    if (total == 0) & (c == 0):
        tl.store(out_ptr + b, tl.zeros([], tl.int64))


def draw(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """``draws.draw``: rows of up to ``DRAW_CHUNK`` tokens in one launch, several a program; longer rows in two
    launches over ``(B, cdiv(V, DRAW_CHUNK))`` programs (a row split over many SMs: batch 1 is latency-bound), chunk
    sums, then the chunk that holds the row's ``x`` inverts its running sum."""
    B, V = probs.shape
    out = torch.empty(B, dtype=torch.int64, device=probs.device)
    if B == 0:
        return out
    probs = probs.contiguous()
    seeds = seeds.to(device=probs.device, dtype=torch.int64).contiguous()
    positions = positions.to(device=probs.device, dtype=torch.int64).contiguous()
    keyed = dict(STREAM=stream, K0=draws.K0, K1=draws.K1, M1=draws.M1, M2=draws.M2)
    if V <= DRAW_CHUNK:  # the whole row in one tile: rows a program, one launch
        block_v = triton.next_power_of_2(V)
        block_r = min(64, DRAW_CHUNK // block_v)
        _draw_rows_kernel[(triton.cdiv(B, block_r),)](
            probs, seeds, positions, out, B, V, probs.stride(0), BLOCK_R=block_r, BLOCK_V=block_v, num_warps=8, **keyed,
            **dispatch.pdl_args(B),
        )  # fmt: skip
        return out
    C = triton.cdiv(V, DRAW_CHUNK)
    sums = torch.empty((B, C), dtype=torch.float64, device=probs.device)
    last = torch.empty((B, C), dtype=torch.int32, device=probs.device)
    _chunk_sums_kernel[(B, C)](
        probs, sums, last, V, C, probs.stride(0), CHUNK=DRAW_CHUNK, num_warps=8, **dispatch.pdl_args(B)
    )
    _draw_chunk_kernel[(B, C)](
        probs, sums, last, seeds, positions, out, V, C, probs.stride(0), CHUNK=DRAW_CHUNK,
        C_POW2=triton.next_power_of_2(C), num_warps=8, **keyed, **dispatch.pdl_args(B),
    )  # fmt: skip
    return out
