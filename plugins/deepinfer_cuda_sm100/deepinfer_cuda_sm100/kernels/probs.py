"""The sampler's ``probs`` without a sort: temperature, top-k, softmax, top-p and min-p over rows split into chunks.

Top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (equal probabilities in token-id
order). With ``F(v)``, the mass of the tokens more likely than ``v``, the kept set is every token more likely
than ``t* = min{v : F(v) < top_p}``, plus the first ``n`` tokens of probability exactly ``t*`` by id, ``n`` the
most with ``F(t*) + (n - 1) t* < top_p``. ``t*`` is found by a radix search on the probabilities' float bits
(a probability in ``[0, 1]`` has bits 31 and 30 clear, so ten 3-bit digits): each pass sums, per chunk, the mass
of the tokens in each of the 8 buckets of the next digit under the prefix found so far; the next
pass reduces those partials (in a fixed order, so a row's result depends only on its own logits) and keeps the
highest bucket whose mass, with everything above it, still reaches ``top_p``. Top-k is the same search with
every token weighing 1 and the target ``k``, on an order-preserving integer image of ``logits / T`` (eight
4-bit digits): it finds the k-th largest value, and every token at least that large stays (ties at the k-th
value kept). No ``[B, V]`` sort: a whole batch in 12 launches with top-p (statistics, softmax with the first pass,
nine passes, the cut), 20 with top-k too, and two more for the draw. ``min_p`` keeps ``p >= min_p * max(p)``; top-p and min-p
keep upper sets, so the mass that renormalises is known without another pass. Greedy rows (temperature 0) get a
one-hot at the first maximum of the logits. The same order, tie rules and cuts as the reference op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter

#: tokens a program of every launch reads (a row of 129,280 is 32 chunks)
PROBS_CHUNK = 4096
#: digit widths: top-p's over the 30 bits of a probability (bits 31 and 30 of a float in [0, 1] are clear), ten
#: 3-bit digits; top-k's over the 32-bit order-preserving image of ``logits / T``, eight 4-bit digits. A pass costs
#: about ``2**DBITS`` compare-select-adds a token, so narrow digits in more passes cost less (H100, v30: 5-bit digits
#: made the passes compute-bound)
DBITS_P, DBITS_K = 3, 4
#: a histogram tile holds ``HIST_TILE // 2**DBITS`` tokens (``[tokens, buckets]`` per-thread accumulators)
HIST_TILE = 8192
#: top-p's pass that writes out the tokens in its range (later passes read only those; -1: every pass reads the
#: row): after three 3-bit digits the range is a quarter of a binade. With ``dispatch.probs_compact_first``: pass 0
#: (inside the softmax kernel), writing out the tokens that are not negligible (``_negligible``)
COMPACT_P = 3
#: with ``dispatch.probs_compact_first``, the passes over compacted tokens: tokens a tile and warps a program (a
#: chunk holds few such tokens; 8,192 programs of 8 warps at 256 rows ran 7.8 waves of mostly latency)
COMPACTED_TILE, COMPACTED_WARPS = 256, 2
#: top-p's first pass inside the softmax kernel, over the probabilities it has just computed (one read of the
#: ``[B, V]`` probabilities and one launch fewer; the same partials, bit for bit)
FUSE_PASS0 = True


@triton.jit
def _xkey(x):
    """An int32 whose bits, read as an unsigned number, order as the floats ``x`` do (``-0.0`` as ``0.0``)."""
    b = (x + 0.0).to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) | -2147483648)


@triton.jit
def _top_k_of(topk_ptr, b, V):
    """Row ``b``'s ``k`` as float32 (``<= 0``: every token)."""
    k = tl.load(topk_ptr + b)
    return tl.where(k > 0, tl.minimum(k, V), V).to(tl.float32)


@triton.jit
def _scaled_logits(x_ptr, temp_ptr, topk_ptr, mk_ptr, ck_ptr, pk_ptr, ak_ptr, b, v, B, V, C, stride_x,
                   TOPK: tl.constexpr, PASSES_K: tl.constexpr, NB_K: tl.constexpr, C_POW2: tl.constexpr):  # fmt: skip
    """``x = logits / T`` (``T`` 1 for greedy rows) at tokens ``v``; with ``TOPK``, the tokens below the row's
    k-th largest ``x`` (found by the top-k passes) set to ``-inf``."""
    t = tl.load(temp_ptr + b)
    x = tl.load(x_ptr + b * stride_x + v, mask=v < V, other=float("-inf")) / tl.where(t <= 0, 1.0, t)
    if TOPK:
        last = (PASSES_K - 1) * B * C * NB_K
        kth, _a, _n, _j = _advance(
            mk_ptr + last, ck_ptr + last, b, C, tl.load(pk_ptr + (PASSES_K - 1) * B + b),
            tl.load(ak_ptr + (PASSES_K - 1) * B + b), _top_k_of(topk_ptr, b, V), 0, NB_K, C_POW2,
        )  # fmt: skip
        x = tl.where((_xkey(x) ^ -2147483648) >= (kth ^ -2147483648), x, float("-inf"))
    return x


@triton.jit
def _stats_kernel(x_ptr, temp_ptr, topk_ptr, mk_ptr, ck_ptr, pk_ptr, ak_ptr, cmax_ptr, csum_ptr, cidx_ptr, B, V, C,
                  stride_x, TOPK: tl.constexpr, PASSES_K: tl.constexpr, NB_K: tl.constexpr, CHUNK: tl.constexpr,
                  C_POW2: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: a chunk's max of ``x``, its sum of ``exp(x - max)`` and its first argmax."""
    pdl_enter(PDL)
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    v = c * CHUNK + tl.arange(0, CHUNK)
    x = _scaled_logits(x_ptr, temp_ptr, topk_ptr, mk_ptr, ck_ptr, pk_ptr, ak_ptr, b, v, B, V, C, stride_x, TOPK,
                       PASSES_K, NB_K, C_POW2)  # fmt: skip
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
def _negligible(topp_ptr, b, V):
    """Half of ``(1 - top_p) / V``: top-p's searches count only tokens more likely than this. All the tokens at or
    below it weigh at most ``(1 - top_p) / 2``, so the tokens above it weigh more than ``top_p``: the threshold
    ``t*`` lies above it, every bucket a search picks holds every token above it that the bucket's range holds,
    and leaving the others out changes no choice (nor the ties at ``t*``, nor the mass above it). A row of mostly
    negligible tokens is then compacted to its few likely ones by the first pass."""
    return 0.5 * (1.0 - tl.minimum(tl.load(topp_ptr + b), 1.0)) / V


@triton.jit
def _softmax_kernel(x_ptr, temp_ptr, topk_ptr, mk_ptr, ck_ptr, pk_ptr, ak_ptr, minp_ptr, topp_ptr, cmax_ptr, csum_ptr,
                    out_ptr, ge_ptr, mass_ptr, cnt_ptr, pref_ptr, above_ptr, kept_ptr, nkept_ptr, B, V, C, stride_x,
                    stride_o,
                    TOPK: tl.constexpr, PASSES_K: tl.constexpr, NB_K: tl.constexpr, CHUNK: tl.constexpr,
                    C_POW2: tl.constexpr, PASS0: tl.constexpr, DBITS: tl.constexpr, BITS: tl.constexpr,
                    COMPACT: tl.constexpr, SUB: tl.constexpr, NEGLIGIBLE: tl.constexpr = False,
                    PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: ``p = exp(x - max) / sum`` written to ``out``, ``SUB`` tokens at a time; per chunk, the mass
    of the tokens min-p keeps (``p >= min_p * max p``, ``max p = 1 / sum``; every token's with min-p 0). With
    ``PASS0``, also top-p's first pass (``_radix_pass_kernel`` with ``PASS = 0``) over the ``p`` in registers: the
    same partials, bit for bit, without reading the row again (and with ``COMPACT == 0`` the same tokens kept)."""
    pdl_enter(PDL)
    NB: tl.constexpr = 1 << DBITS
    SH: tl.constexpr = BITS - DBITS
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    m, s = _row_softmax(cmax_ptr, csum_ptr, b, C, C_POW2)
    tau = tl.load(minp_ptr + b) * (1.0 / s)
    ge = tl.zeros([SUB], tl.float32)
    acc = _hist_zeros(SUB, NB, tl.float32)
    kept = kept_ptr + (b * C + c) * CHUNK
    n = tl.zeros([], tl.int32)
    if NEGLIGIBLE:
        eps = _negligible(topp_ptr, b, V)
    else:
        eps = -1.0
    for s0 in range(0, CHUNK, SUB):
        v = c * CHUNK + s0 + tl.arange(0, SUB)
        x = _scaled_logits(x_ptr, temp_ptr, topk_ptr, mk_ptr, ck_ptr, pk_ptr, ak_ptr, b, v, B, V, C, stride_x, TOPK,
                           PASSES_K, NB_K, C_POW2)  # fmt: skip
        p = tl.exp(x - m) / s
        tl.store(out_ptr + b * stride_o + v, p, mask=v < V)
        ge += tl.where((v < V) & (p >= tau), p, 0.0)
        if PASS0:
            acc, _cnt, n = _tile_hist(acc, acc.to(tl.int32), p, p.to(tl.int32, bitcast=True), (v < V) & (p > eps),
                                      kept, n, SH, NB, False, COMPACT == 0)  # fmt: skip
    tl.store(ge_ptr + b * C + c, tl.sum(ge, axis=0))
    if PASS0:
        if c == 0:
            tl.store(pref_ptr + b, 0)
            tl.store(above_ptr + b, 0.0)
        if COMPACT == 0:
            tl.store(nkept_ptr + b * C + c, n)
        _store_partials(mass_ptr, cnt_ptr, acc, acc.to(tl.int32), 0, B, b, C, c, NB, False, False)


@triton.jit
def _onehot8(w, dg, base):
    """``[SUB, 2, 2, 2]``: ``w`` at flat index ``dg - base`` (buckets ``base .. base + 7``), 0 elsewhere. The bucket
    dimensions come from ``tl.join``, which keeps them in the thread that holds the token: no layout conversion
    (a ``[SUB, NB]`` tile spread its buckets over 8 threads, and each token went through shared memory to reach
    them, three conversions a tile)."""
    z = tl.zeros_like(w)
    a0 = tl.join(tl.where(dg == base, w, z), tl.where(dg == base + 4, w, z))
    a1 = tl.join(tl.where(dg == base + 1, w, z), tl.where(dg == base + 5, w, z))
    a2 = tl.join(tl.where(dg == base + 2, w, z), tl.where(dg == base + 6, w, z))
    a3 = tl.join(tl.where(dg == base + 3, w, z), tl.where(dg == base + 7, w, z))
    return tl.join(tl.join(a0, a2), tl.join(a1, a3))  # [t, d1, d2, d3] holds bucket base + 4 d1 + 2 d2 + d3


@triton.jit
def _onehot(w, dg, NB: tl.constexpr):
    """``w`` spread over ``NB`` buckets by digit ``dg`` (``NB`` or more: no bucket), buckets in-thread: ``[SUB, 2, 2,
    2]`` for 8 buckets, ``[SUB, 2, 2, 2, 2]`` for 16 (the last dimension the top bit), ``[SUB, NB]`` otherwise."""
    if NB == 8:
        return _onehot8(w, dg, 0)
    elif NB == 16:
        return tl.join(_onehot8(w, dg, 0), _onehot8(w, dg, 8))
    else:
        return tl.where(dg[:, None] == tl.arange(0, NB)[None, :], w[:, None], tl.zeros_like(w)[:, None])


@triton.jit
def _hist_zeros(SUB: tl.constexpr, NB: tl.constexpr, DT: tl.constexpr):
    """Zeros shaped and laid out as :func:`_onehot`'s tiles."""
    return _onehot(tl.zeros([SUB], DT), tl.full([SUB], NB, tl.int32), NB)


@triton.jit
def _bucket_sums(acc, NB: tl.constexpr):
    """``[NB]`` per-bucket sums over the tokens of a :func:`_onehot`-shaped accumulator, in bucket order."""
    t = tl.sum(acc, axis=0)
    if NB == 16:
        t = tl.permute(t, (3, 0, 1, 2))
    return tl.reshape(t, [NB])


@triton.jit
def _tile_hist(acc, accn, w, key, inside, kept, n, SH: tl.constexpr, NB: tl.constexpr, COUNT: tl.constexpr,
               WRITE: tl.constexpr):  # fmt: skip
    """One tile of a pass: ``w`` added to the bucket of its digit (``key >> SH``, ``NB`` buckets) where ``inside``
    (per thread: ``acc``, :func:`_onehot`-shaped, reduced once after the loop), counted too with ``COUNT``; with
    ``WRITE`` the weights inside appended to ``kept`` after the ``n`` already there. Returns ``acc``, ``accn``, ``n``."""
    dg = tl.where(inside, (key >> SH) & (NB - 1), NB)
    acc += _onehot(w, dg, NB)
    if COUNT:
        accn += _onehot(tl.full(w.shape, 1, tl.int32), dg, NB)
    if WRITE:
        at = n + tl.cumsum(inside.to(tl.int32), axis=0) - 1
        tl.store(kept + at, w, mask=inside)
        n += tl.sum(inside.to(tl.int32), axis=0)
    return acc, accn, n


@triton.jit
def _store_partials(mass_ptr, cnt_ptr, acc, accn, PASS: tl.constexpr, B, b, C, c, NB: tl.constexpr,
                    COUNT: tl.constexpr, TOPK: tl.constexpr):  # fmt: skip
    """A chunk's partials of pass ``PASS``: the weight per bucket, and the count (top-p: only where ``COUNT``, the
    last pass, whose ties at ``t*`` are counted; before it, whether a bucket has mass)."""
    nb = tl.arange(0, NB)
    acc_m = _bucket_sums(acc, NB)
    if COUNT:
        acc_c = _bucket_sums(accn, NB)
    elif TOPK:  # every weight is 1: the sums are the counts
        acc_c = acc_m.to(tl.int32)
    else:
        acc_c = (acc_m > 0).to(tl.int32)
    at = ((PASS * B + b) * C + c) * NB + nb
    tl.store(mass_ptr + at, acc_m)
    tl.store(cnt_ptr + at, acc_c)


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
def _radix_pass_kernel(src_ptr, temp_ptr, target_ptr, mass_ptr, cnt_ptr, pref_ptr, above_ptr, kept_ptr, nkept_ptr,
                       B, V, C, stride, PASS: tl.constexpr, DBITS: tl.constexpr, BITS: tl.constexpr,
                       TOPK: tl.constexpr, COMPACT: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
                       C_POW2: tl.constexpr, NEGLIGIBLE: tl.constexpr = False, PDL: tl.constexpr = False):  # fmt: skip
    """Grid ``(B, C)``: pass ``PASS`` of a search. Finds the range this pass splits from the state and the
    partials of the pass before (program ``c = 0`` records the state), then sums its chunk's weight and count per
    bucket of this pass's digit among the tokens in that range (per thread, reduced once at the end). Top-p
    (``src`` the probabilities): keys their bits, weights them, target ``top_p``; the tokens are counted in the
    last pass only (the ties at ``t*``), earlier passes record whether a bucket has mass. Pass ``COMPACT`` (top-p;
    -1: none) also writes its chunk's tokens in the range, in order, to ``kept`` (``[B, C, CHUNK]``, how many in
    ``nkept``); later passes read only those. Top-k (``TOPK``, ``src`` the logits): keys ``_xkey(logits / T)``,
    each token weighs 1, target ``k``."""
    pdl_enter(PDL)
    NB: tl.constexpr = 1 << DBITS
    SH: tl.constexpr = BITS - DBITS * (PASS + 1)
    COUNT: tl.constexpr = (SH == 0) and not TOPK
    b, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if TOPK:
        tgt = _top_k_of(target_ptr, b, V)
        t = tl.load(temp_ptr + b)
        t = tl.where(t <= 0, 1.0, t)
    else:
        tgt = tl.maximum(tl.load(target_ptr + b), 1e-30)
        if NEGLIGIBLE:
            eps = _negligible(target_ptr, b, V)
        else:
            eps = -1.0
    if PASS == 0:
        prefix = tl.zeros([], tl.int32)
        above = tl.zeros([], tl.float32)
    else:
        prev = (PASS - 1) * B * C * NB
        prefix, above, _n, _j = _advance(
            mass_ptr + prev, cnt_ptr + prev, b, C, tl.load(pref_ptr + (PASS - 1) * B + b),
            tl.load(above_ptr + (PASS - 1) * B + b), tgt, SH + DBITS, NB, C_POW2,
        )  # fmt: skip
    if c == 0:
        tl.store(pref_ptr + PASS * B + b, prefix)
        tl.store(above_ptr + PASS * B + b, above)
    acc = _hist_zeros(SUB, NB, tl.float32)  # reduced over the tokens once, after the loop
    accn = _hist_zeros(SUB, NB, tl.int32)
    kept = kept_ptr + (b * C + c) * CHUNK
    n = tl.zeros([], tl.int32)
    if (COMPACT >= 0) and (PASS > COMPACT):  # only the tokens the compacting pass kept
        nk = tl.load(nkept_ptr + b * C + c)
        for s in range(0, nk, SUB):
            o = s + tl.arange(0, SUB)
            w = tl.load(kept + o, mask=o < nk, other=0.0)
            key = w.to(tl.int32, bitcast=True)
            inside = ((key >> (SH + DBITS)) == (prefix >> (SH + DBITS))) & (o < nk)
            acc, accn, n = _tile_hist(acc, accn, w, key, inside, kept, n, SH, NB, COUNT, False)
    else:
        for s in range(0, CHUNK, SUB):
            v = c * CHUNK + s + tl.arange(0, SUB)
            if TOPK:
                key = _xkey(tl.load(src_ptr + b * stride + v, mask=v < V, other=float("-inf")) / t)
                w = tl.full([SUB], 1.0, tl.float32)
            else:
                w = tl.load(src_ptr + b * stride + v, mask=v < V, other=0.0)
                key = w.to(tl.int32, bitcast=True)
            if PASS == 0:
                inside = v < V
            else:
                inside = ((key >> (SH + DBITS)) == (prefix >> (SH + DBITS))) & (v < V)
            if not TOPK:
                inside = inside & (w > eps)
            acc, accn, n = _tile_hist(acc, accn, w, key, inside, kept, n, SH, NB, COUNT, PASS == COMPACT)
        if PASS == COMPACT:
            tl.store(nkept_ptr + b * C + c, n)
    _store_partials(mass_ptr, cnt_ptr, acc, accn, PASS, B, b, C, c, NB, COUNT, TOPK)


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
        inside = ((p > tstar) | (tie & (rank < n))).to(tl.int32) + (1 - cut.to(tl.int32))  # tp >= 1: no cut
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


def _search_state(passes: int, B: int, C: int, nb: int, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """A search's buffers: per pass, the weights and counts per chunk and bucket, the prefix, the weight above."""
    return (torch.empty((passes, B, C, nb), dtype=torch.float32, device=dev),
            torch.empty((passes, B, C, nb), dtype=torch.int32, device=dev),
            torch.empty((passes, B), dtype=torch.int32, device=dev),
            torch.empty((passes, B), dtype=torch.float32, device=dev))  # fmt: skip


def _search(src, temperature, target, state, kept, nkept, passes: int, dbits: int, bits: int, topk: bool,
            compact: int, chunk: int, c2: int, first: int = 0, negligible: bool = False) -> None:  # fmt: skip
    """Launches ``first .. passes - 1`` of one radix search over ``src [B, V]`` (``_radix_pass_kernel``);
    ``negligible``: top-p's, over the tokens that are not (``dispatch.probs_compact_first``)."""
    B, V = src.shape
    C = triton.cdiv(V, chunk)
    for q in range(first, passes):
        light = negligible and 0 <= compact < q  # over the compacted tokens: small programs, many to an SM
        _radix_pass_kernel[(B, C)](
            src, temperature, target, *state, kept, nkept, B, V, C, src.stride(0), PASS=q, DBITS=dbits, BITS=bits,
            TOPK=topk, COMPACT=compact, CHUNK=chunk, SUB=min(COMPACTED_TILE if light else HIST_TILE >> dbits, chunk),
            C_POW2=c2, NEGLIGIBLE=negligible, num_warps=COMPACTED_WARPS if light else 8, **dispatch.pdl_args(B),
        )  # fmt: skip


def probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    top_k_used: bool = True,
    top_p_used: bool = True,
) -> torch.Tensor:
    """``SamplingOps.probs``. ``top_k_used`` / ``top_p_used`` False skip that search (no row's ``top_k`` is
    positive / ``top_p`` below 1): 2 launches, plus 8 for top-k, plus 9 for top-p (its first pass in the softmax's), plus the cut."""
    B, V = logits.shape
    out = torch.empty((B, V), dtype=torch.float32, device=logits.device)
    if B == 0:
        return out
    logits = logits.float().contiguous()
    temperature, top_p, min_p = (t.float().contiguous() for t in (temperature, top_p, min_p))
    top_k = top_k.to(torch.int32).contiguous()
    chunk = PROBS_CHUNK
    C = triton.cdiv(V, chunk)
    c2 = triton.next_power_of_2(C)
    dev = logits.device
    f32 = torch.empty((3, B, C), dtype=torch.float32, device=dev)  # chunk max, exp sums, min-p mass
    cmax, csum, ge = f32.unbind(0)
    cidx = torch.empty((B, C), dtype=torch.int32, device=dev)
    passes_k, passes_p = 32 // DBITS_K, 30 // DBITS_P
    nb_k, nb_p = 1 << DBITS_K, 1 << DBITS_P
    sk = _search_state(passes_k if top_k_used else 1, B, C, nb_k, dev)
    sp = _search_state(passes_p if top_p_used else 1, B, C, nb_p, dev)
    negligible = top_p_used and dispatch.probs_compact_first()
    compact = 0 if negligible else COMPACT_P if top_p_used and 0 <= COMPACT_P < passes_p - 1 else -1
    kept = torch.empty((B, C, chunk) if compact >= 0 else (1,), dtype=torch.float32, device=dev)
    nkept = torch.empty((B, C), dtype=torch.int32, device=dev)
    grid = (B, C)
    fuse0 = top_p_used and FUSE_PASS0
    if top_k_used:
        _search(logits, temperature, top_k, sk, kept, nkept, passes_k, DBITS_K, 32, True, -1, chunk, c2)
    topk = dict(TOPK=top_k_used, PASSES_K=passes_k, NB_K=nb_k, CHUNK=chunk, C_POW2=c2, num_warps=8)
    _stats_kernel[grid](
        logits, temperature, top_k, *sk, cmax, csum, cidx, B, V, C, logits.stride(0), **topk, **dispatch.pdl_args(B)
    )  # fmt: skip
    _softmax_kernel[grid](
        logits, temperature, top_k, *sk, min_p, top_p, cmax, csum, out, ge, *sp, kept, nkept, B, V, C, logits.stride(0),
        out.stride(0), **topk, PASS0=fuse0, DBITS=DBITS_P, BITS=30, COMPACT=compact,
        SUB=min(HIST_TILE >> DBITS_P, chunk), NEGLIGIBLE=negligible, **dispatch.pdl_args(B),
    )  # fmt: skip
    if top_p_used:
        _search(
            out,
            temperature,
            top_p,
            sp,
            kept,
            nkept,
            passes_p,
            DBITS_P,
            30,
            False,
            compact,
            chunk,
            c2,
            int(fuse0),
            negligible,
        )
    _cut_kernel[grid](
        out, temperature, top_p, min_p, cmax, csum, cidx, ge, *sp, B, V, C, out.stride(0), TOPP=top_p_used,
        PASSES=passes_p, NB=nb_p, CHUNK=chunk, C_POW2=c2, num_warps=8, **dispatch.pdl_args(B),
    )  # fmt: skip
    return out
