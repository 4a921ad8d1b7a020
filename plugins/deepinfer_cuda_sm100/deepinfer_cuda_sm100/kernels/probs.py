"""The sampler's ``probs`` without a sort: temperature, softmax, top-p and min-p over rows split into chunks.

Top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (equal probabilities in token-id
order). With ``F(v)``, the mass of the tokens more likely than ``v``, the kept set is every token more likely
than ``t* = min{v : F(v) < top_p}``, plus the first ``n`` tokens of probability exactly ``t*`` by id, ``n`` the
most with ``F(t*) + (n - 1) t* < top_p``. ``t*`` is found by a radix search on the probabilities' float bits
(a probability in ``[0, 1]`` has bits 31 and 30 clear, so six 5-bit digits): each pass sums, per chunk, the mass
and count of the tokens in each of the 32 buckets of the next digit under the prefix found so far; the next
pass reduces those partials (in a fixed order, so a row's result depends only on its own logits) and keeps the
highest bucket whose mass, with everything above it, still reaches ``top_p``. No ``[B, V]`` sort, a whole batch
in nine launches (two more for the draw): statistics, softmax, six passes, the cut. ``min_p`` keeps
``p >= min_p * max(p)``; both cuts keep upper sets, so the mass that renormalises is known without another pass.
Greedy rows (temperature 0) get a one-hot at the first maximum of the logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter

#: tokens a program of every launch reads (a row of 129,280 is 32 chunks)
PROBS_CHUNK = 4096
DBITS = 5
NB = 1 << DBITS  # buckets of a digit
PASSES = 6  # 30 bits
SUB = 256  # tokens a histogram tile holds ([SUB, NB] compares)


@triton.jit
def _stats_kernel(x_ptr, temp_ptr, cmax_ptr, csum_ptr, cidx_ptr, V, C, stride_x, CHUNK: tl.constexpr,
                  PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: a chunk's max of ``x = logits / T``, its sum of ``exp(x - max)`` and its first argmax."""
    pdl_enter(PDL)
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    v = c * CHUNK + tl.arange(0, CHUNK)
    t = tl.load(temp_ptr + b)
    x = tl.load(x_ptr + b * stride_x + v, mask=v < V, other=float("-inf")) / tl.where(t <= 0, 1.0, t)
    mx = tl.max(x, axis=0)
    s = tl.sum(tl.exp(x - mx), axis=0)
    tl.store(cmax_ptr + b * C + c, mx)
    tl.store(csum_ptr + b * C + c, tl.where(mx == float("-inf"), 0.0, s))
    tl.store(cidx_ptr + b * C + c, c * CHUNK + tl.argmax(x, axis=0, tie_break_left=True))


@triton.jit
def _row_softmax(cmax_ptr, csum_ptr, b, C, C_POW2: tl.constexpr):
    """The row's max and softmax denominator from its chunks' (every chunk of the row computes the same bits)."""
    i = tl.arange(0, C_POW2)
    mx = tl.load(cmax_ptr + b * C + i, mask=i < C, other=float("-inf"))
    m = tl.max(mx, axis=0)
    s = tl.load(csum_ptr + b * C + i, mask=i < C, other=0.0)
    return m, tl.sum(tl.where(mx == float("-inf"), 0.0, s * tl.exp(mx - m)), axis=0)


@triton.jit
def _softmax_kernel(x_ptr, temp_ptr, minp_ptr, cmax_ptr, csum_ptr, out_ptr, ge_ptr, V, C, stride_x,
                    stride_o, CHUNK: tl.constexpr, C_POW2: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: ``p = exp(x - max) / sum`` written to ``out``; per chunk, the mass of the tokens min-p
    keeps (``p >= min_p * max p``, ``max p = 1 / sum``; every token's with min-p 0)."""
    pdl_enter(PDL)
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    m, s = _row_softmax(cmax_ptr, csum_ptr, b, C, C_POW2)
    v = c * CHUNK + tl.arange(0, CHUNK)
    t = tl.load(temp_ptr + b)
    x = tl.load(x_ptr + b * stride_x + v, mask=v < V, other=float("-inf")) / tl.where(t <= 0, 1.0, t)
    p = tl.exp(x - m) / s
    tl.store(out_ptr + b * stride_o + v, p, mask=v < V)
    tau = tl.load(minp_ptr + b) * (1.0 / s)
    tl.store(ge_ptr + b * C + c, tl.sum(tl.where((v < V) & (p >= tau), p, 0.0), axis=0))


@triton.jit
def _advance(mass_ptr, cnt_ptr, b, C, prefix, above, tp, SHIFT: tl.constexpr, NB: tl.constexpr,
             C_POW2: tl.constexpr):  # fmt: skip
    """One digit of the search from a pass's per-chunk partials (``[C, NB]`` of row ``b`` at ``mass_ptr`` /
    ``cnt_ptr``): the highest bucket ``j`` where ``above`` plus the mass of buckets ``>= j`` reaches ``tp`` (the
    lowest non-empty bucket if none: the whole row's mass is short of ``tp``). Returns the prefix with the digit
    set, the mass above the new range, and how many tokens the bucket holds."""
    i = tl.arange(0, C_POW2)[:, None]
    j = tl.arange(0, NB)
    rows = (b * C + i) * NB + j[None, :]
    mass = tl.sum(tl.load(mass_ptr + rows, mask=i < C, other=0.0), axis=0)
    cnt = tl.sum(tl.load(cnt_ptr + rows, mask=i < C, other=0), axis=0)
    suffix = tl.sum(tl.where(j[None, :] >= j[:, None], mass[None, :], 0.0), axis=1)  # [j]: buckets >= j
    star = tl.max(tl.where(above + suffix >= tp, j, -1), axis=0)
    star = tl.where(star < 0, tl.min(tl.where(cnt > 0, j, NB), axis=0), star)
    above = above + tl.sum(tl.where(j == star + 1, suffix, 0.0), axis=0)
    return prefix | (star << SHIFT), above, tl.sum(tl.where(j == star, cnt, 0), axis=0), star


@triton.jit
def _topp_pass_kernel(p_ptr, topp_ptr, mass_ptr, cnt_ptr, pref_ptr, above_ptr, B, V, C, stride_p,
                      PASS: tl.constexpr, DBITS: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
                      C_POW2: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: pass ``PASS`` of the search. Finds the range this pass splits from the state and the
    partials of the pass before (program ``c = 0`` records the state), then sums its chunk's mass and count per
    bucket of this pass's digit among the tokens in that range."""
    pdl_enter(PDL)
    NB: tl.constexpr = 1 << DBITS
    SH: tl.constexpr = 30 - DBITS * (PASS + 1)
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    tp = tl.maximum(tl.load(topp_ptr + b), 1e-30)
    if PASS == 0:
        prefix = tl.zeros([], tl.int32)
        above = tl.zeros([], tl.float32)
    else:
        prev = (PASS - 1) * B * C * NB
        prefix, above, _n, _j = _advance(
            mass_ptr + prev, cnt_ptr + prev, b, C, tl.load(pref_ptr + (PASS - 1) * B + b),
            tl.load(above_ptr + (PASS - 1) * B + b), tp, SH + DBITS, NB, C_POW2,
        )  # fmt: skip
    if c == 0:
        tl.store(pref_ptr + PASS * B + b, prefix)
        tl.store(above_ptr + PASS * B + b, above)
    nb = tl.arange(0, NB)
    acc_m = tl.zeros([NB], tl.float32)
    acc_c = tl.zeros([NB], tl.int32)
    for s in range(0, CHUNK, SUB):
        v = c * CHUNK + s + tl.arange(0, SUB)
        p = tl.load(p_ptr + b * stride_p + v, mask=v < V, other=0.0)
        key = p.to(tl.int32, bitcast=True)
        inside = ((key >> (SH + DBITS)) == (prefix >> (SH + DBITS))) & (v < V)
        hit = inside[:, None] & (((key >> SH) & (NB - 1))[:, None] == nb[None, :])
        acc_m += tl.sum(tl.where(hit, p[:, None], 0.0), axis=0)
        acc_c += tl.sum(hit.to(tl.int32), axis=0)
    at = ((PASS * B + b) * C + c) * NB + nb
    tl.store(mass_ptr + at, acc_m)
    tl.store(cnt_ptr + at, acc_c)


@triton.jit
def _cut_kernel(out_ptr, temp_ptr, topp_ptr, minp_ptr, cmax_ptr, csum_ptr, cidx_ptr, ge_ptr, mass_ptr,
                cnt_ptr, pref_ptr, above_ptr, B, V, C, stride_o, TOPP: tl.constexpr, PASSES: tl.constexpr,
                NB: tl.constexpr, CHUNK: tl.constexpr, C_POW2: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: the last digit of the search, then each token of the chunk kept or zeroed and the kept
    ones renormalised; greedy rows get their one-hot."""
    pdl_enter(PDL)
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    m, s = _row_softmax(cmax_ptr, csum_ptr, b, C, C_POW2)
    i = tl.arange(0, C_POW2)
    massge = tl.sum(tl.load(ge_ptr + b * C + i, mask=i < C, other=0.0), axis=0)
    v = c * CHUNK + tl.arange(0, CHUNK)
    p = tl.load(out_ptr + b * stride_o + v, mask=v < V, other=0.0)
    tau = tl.load(minp_ptr + b) * (1.0 / s)
    keep = p >= tau
    norm = massge
    if TOPP:
        tp = tl.load(topp_ptr + b)
        last = (PASSES - 1) * B * C * NB
        key, above, ties, star = _advance(
            mass_ptr + last, cnt_ptr + last, b, C, tl.load(pref_ptr + (PASSES - 1) * B + b),
            tl.load(above_ptr + (PASSES - 1) * B + b), tl.maximum(tp, 1e-30), 0, NB, C_POW2,
        )  # fmt: skip
        tstar = key.to(tl.float32, bitcast=True)
        room = tl.where(tstar > 0, tl.math.ceil((tp - above) / tstar), ties.to(tl.float32))
        n = tl.maximum(tl.minimum(room, ties.to(tl.float32)), 1.0).to(tl.int32)
        before = tl.sum(tl.load(cnt_ptr + (last + (b * C + i) * NB + star), mask=i < c, other=0), axis=0)
        tie = (p == tstar) & (v < V)
        rank = before + tl.cumsum(tie.to(tl.int32), axis=0) - 1
        cut = tp < 1
        inside = ((p > tstar) | (tie & (rank < n))).to(tl.int32) + (tp >= 1).to(tl.int32)  # tp >= 1: no cut
        keep = keep & (inside > 0)
        norm = tl.where(cut & (tau <= tstar), above + n.to(tl.float32) * tstar, massge)
    res = tl.where(keep, p / norm, 0.0)
    t = tl.load(temp_ptr + b)
    if t <= 0:
        cm = tl.load(cmax_ptr + b * C + i, mask=i < C, other=float("-inf"))
        first = tl.min(
            tl.where(cm == m, tl.load(cidx_ptr + b * C + i, mask=i < C, other=0), 2147483647), axis=0
        )
        res = (v == first).to(tl.float32)
    tl.store(out_ptr + b * stride_o + v, res, mask=v < V)


def probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    top_p_used: bool = True,
) -> torch.Tensor:
    """``SamplingOps.probs`` for rows that use no top-k (``top_k`` is ignored: the caller sends rows with top-k to
    the sorting path). ``top_p_used`` False skips the search (no row's ``top_p`` is below 1)."""
    B, V = logits.shape
    out = torch.empty((B, V), dtype=torch.float32, device=logits.device)
    if B == 0:
        return out
    logits = logits.float().contiguous()
    temperature, top_p, min_p = (t.float().contiguous() for t in (temperature, top_p, min_p))
    chunk = PROBS_CHUNK
    C = triton.cdiv(V, chunk)
    c2 = triton.next_power_of_2(C)
    dev = logits.device
    f32 = torch.empty((3, B, C), dtype=torch.float32, device=dev)  # chunk max, exp sums, min-p mass
    cmax, csum, ge = f32.unbind(0)
    cidx = torch.empty((B, C), dtype=torch.int32, device=dev)
    passes = PASSES if top_p_used else 1
    mass = torch.empty((passes, B, C, NB), dtype=torch.float32, device=dev)
    cnt = torch.empty((passes, B, C, NB), dtype=torch.int32, device=dev)
    pref = torch.empty((passes, B), dtype=torch.int32, device=dev)
    above = torch.empty((passes, B), dtype=torch.float32, device=dev)
    grid = (B, C)
    _stats_kernel[grid](
        logits, temperature, cmax, csum, cidx, V, C, logits.stride(0), CHUNK=chunk, num_warps=8,
        **dispatch.pdl_args(B),
    )  # fmt: skip
    _softmax_kernel[grid](
        logits, temperature, min_p, cmax, csum, out, ge, V, C, logits.stride(0), out.stride(0), CHUNK=chunk,
        C_POW2=c2, num_warps=8, **dispatch.pdl_args(B),
    )  # fmt: skip
    if top_p_used:
        for q in range(PASSES):
            _topp_pass_kernel[grid](
                out, top_p, mass, cnt, pref, above, B, V, C, out.stride(0), PASS=q, DBITS=DBITS, CHUNK=chunk,
                SUB=min(SUB, chunk), C_POW2=c2, num_warps=8, **dispatch.pdl_args(B),
            )  # fmt: skip
    _cut_kernel[grid](
        out, temperature, top_p, min_p, cmax, csum, cidx, ge, mass, cnt, pref, above, B, V, C, out.stride(0),
        TOPP=top_p_used, PASSES=PASSES, NB=NB, CHUNK=chunk, C_POW2=c2, num_warps=8, **dispatch.pdl_args(B),
    )  # fmt: skip
    return out
