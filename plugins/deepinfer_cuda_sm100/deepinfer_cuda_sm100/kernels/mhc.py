"""mHC (manifold-constrained hyper-connections): stream mixing before and after each sublayer.

``hc_pre`` is two launches:

1. ``_hc_mixes_kernel``: split-K partials of ``x.flatten() @ fn.T`` and of ``sum(x^2)`` for
   ``BLOCK_T`` tokens, one pass over ``x``, float32 (3xTF32 on the tensor cores). The unweighted
   RMSNorm is a per-row scalar, so it is applied to the product afterwards; split-K keeps all
   multiprocessors busy at decode batch sizes, where ``T`` alone gives a handful of programs.
2. ``_hc_split_kernel``: per token and ``BLOCK_D`` channels, sums the partials, then the sigmoid
   gates, the Sinkhorn-Knopp
   projection of the ``N x N`` mixing matrix (in registers; each channel block recomputes it, which
   costs less than a third launch) and the collapse ``sum_n pre[n] * x[n]``.

``hc_post`` is one launch over ``(token, channel block)``; ``hc_head`` reuses both ``hc_pre`` kernels
with only the ``pre`` gate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import arrival_counters, pdl_enter, pow2


@triton.jit
def _hc_mixes_kernel(x_ptr, fn_ptr, part_ptr, sq_ptr, T, K, M, k_per_split, stride_xt, stride_fn,
                     BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, DOT: tl.constexpr,
                     PDL: tl.constexpr = False):  # fmt: skip
    """Split-K partials: ``part[s, t, :] = x[t, Ks] @ fn[:, Ks].T`` and ``sq[s, t] = sum(x[t, Ks]^2)``
    (``DOT``: on the tensor cores, 16 rows at least; else, for one token, float32 products on the CUDA cores)."""
    pdl_enter(PDL)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    split = tl.program_id(1)
    rm = rows < T
    ks = tl.arange(0, BLOCK_K)
    ms = tl.arange(0, BLOCK_M)
    mm = ms < M
    acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)
    k_end = tl.minimum(K, (split + 1) * k_per_split)
    for k0 in range(split * k_per_split, k_end, BLOCK_K):
        km = k0 + ks < k_end
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xt + k0 + ks[None, :], mask=rm[:, None] & km[None, :],
                    other=0.0).to(tl.float32)  # fmt: skip
        f = tl.load(
            fn_ptr + ms[:, None] * stride_fn + k0 + ks[None, :], mask=mm[:, None] & km[None, :], other=0.0
        )
        sq += tl.sum(x * x, axis=1)
        if DOT:
            acc += tl.dot(x, tl.trans(f), input_precision="tf32x3")
        else:
            acc += tl.sum(x[:, None, :] * f[None, :, :], axis=2)
    tl.store(part_ptr + (split * T + rows[:, None]) * M + ms[None, :], acc, mask=rm[:, None] & mm[None, :])
    tl.store(sq_ptr + split * T + rows, sq, mask=rm)


@triton.jit
def _load_mix(part_ptr, sq_ptr, offs, mask, t, T, M, n_split, rstd_k, eps, BLOCK_S: tl.constexpr,
              CACHE: tl.constexpr):  # fmt: skip
    """Sum the split-K partials of mixes ``offs`` (1-D) of token ``t`` and apply the RMSNorm scalar. All
    splits are one ``[BLOCK_S, len(offs)]`` load, so the sum costs one memory latency, not one per split.
    ``CACHE=".cg"``: partials stored by other programs of the same launch (read past L1)."""
    s = tl.arange(0, BLOCK_S)
    sm = s < n_split
    acc = tl.load(
        part_ptr + ((s * T + t) * M)[:, None] + offs[None, :],
        mask=sm[:, None] & mask[None, :],
        other=0.0,
        cache_modifier=CACHE,
    )
    sq = tl.sum(tl.load(sq_ptr + s * T + t, mask=sm, other=0.0, cache_modifier=CACHE), axis=0)
    return tl.sum(acc, axis=0) / tl.sqrt(sq * rstd_k + eps)


@triton.jit
def _pre_gate(part_ptr, sq_ptr, scale_ptr, base_ptr, t, T, N, M, n_split, inv_k, hc_eps, norm_eps,
              BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, CACHE: tl.constexpr):  # fmt: skip
    """``pre = sigmoid(mix * scale[0] + base) + hc_eps`` of token ``t`` -> ``[BLOCK_N]``."""
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    pre_l = _load_mix(part_ptr, sq_ptr, n, nm, t, T, M, n_split, inv_k, norm_eps, BLOCK_S, CACHE)
    return tl.sigmoid(pre_l * tl.load(scale_ptr) + tl.load(base_ptr + n, mask=nm, other=0.0)) + hc_eps


@triton.jit
def _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, n_split, iters, inv_k,
               hc_eps, norm_eps, BLOCK_N: tl.constexpr, BLOCK_NN: tl.constexpr, BLOCK_S: tl.constexpr,
               CACHE: tl.constexpr, SINK4: tl.constexpr):  # fmt: skip
    """Store token ``t``'s ``post = 2 sigmoid(.)`` and ``comb``, the Sinkhorn-Knopp projection of
    ``softmax(.) + hc_eps`` (``iters`` column/row normalisations, columns first), computed in registers
    (``SINK4``, ``N == 4``: as 16 scalars, :func:`_sinkhorn4`)."""
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    post_l = _load_mix(part_ptr, sq_ptr, N + n, nm, t, T, M, n_split, inv_k, norm_eps, BLOCK_S, CACHE)
    post_l = post_l * tl.load(scale_ptr + 1) + tl.load(base_ptr + N + n, mask=nm, other=0.0)
    tl.store(post_ptr + t * N + n, 2.0 * tl.sigmoid(post_l), mask=nm)
    cm = nm[:, None] & nm[None, :]
    jk = n[:, None] * N + n[None, :]
    c = _load_mix(part_ptr, sq_ptr, tl.reshape(2 * N + jk, [BLOCK_NN]), tl.reshape(cm, [BLOCK_NN]), t, T, M,
                  n_split, inv_k, norm_eps, BLOCK_S, CACHE)  # fmt: skip
    c = tl.reshape(c, [BLOCK_N, BLOCK_N]) * tl.load(scale_ptr + 2)
    c = tl.where(cm, c + tl.load(base_ptr + 2 * N + jk, mask=cm, other=0.0), float("-inf"))
    if SINK4:  # N == 4: the logits go to comb_ptr, whose entries _sinkhorn4 then projects as scalars
        tl.store(comb_ptr + t * N * N + jk, c, mask=cm)
        tl.debug_barrier()
        _sinkhorn4(comb_ptr + t * N * N, iters, hc_eps)
    else:
        c = tl.exp(c - tl.max(c, axis=1)[:, None])
        c = tl.where(cm, c / tl.sum(c, axis=1)[:, None] + hc_eps, 0.0)
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
        for _ in range(iters - 1):
            c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
            c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
        tl.store(comb_ptr + t * N * N + jk, c, mask=cm)


@triton.jit
def _norm4(a, b, c, d, eps):
    """Four entries divided by their sum plus ``eps`` (one division, four products)."""
    r = 1.0 / (a + b + c + d + eps)
    return a * r, b * r, c * r, d * r


@triton.jit
def _softmax4(a, b, c, d, eps):
    m = tl.maximum(tl.maximum(a, b), tl.maximum(c, d))
    a, b, c, d = tl.exp(a - m), tl.exp(b - m), tl.exp(c - m), tl.exp(d - m)
    r = 1.0 / (a + b + c + d)
    return a * r + eps, b * r + eps, c * r + eps, d * r + eps


@triton.jit
def _load4(ptr):
    return tl.load(ptr), tl.load(ptr + 1), tl.load(ptr + 2), tl.load(ptr + 3)


@triton.jit
def _store4(ptr, a, b, c, d):
    tl.store(ptr, a)
    tl.store(ptr + 1, b)
    tl.store(ptr + 2, c)
    tl.store(ptr + 3, d)


@triton.jit
def _sinkhorn4(comb_ptr, iters, hc_eps):
    """``comb_ptr[0:16]`` holds a 4 x 4 mixing matrix's logits (row-major); replace them with the Sinkhorn-Knopp
    projection of their row softmax plus ``hc_eps`` (as :func:`_post_comb`). The 16 entries are scalars, so
    every thread holds all of them and the ~40 dependent normalisations need no shuffle or barrier: in a
    program of several warps a ``[4, 4]`` tensor's sums go through shared memory, a barrier each."""
    c00, c01, c02, c03 = _load4(comb_ptr)
    c10, c11, c12, c13 = _load4(comb_ptr + 4)
    c20, c21, c22, c23 = _load4(comb_ptr + 8)
    c30, c31, c32, c33 = _load4(comb_ptr + 12)
    tl.debug_barrier()  # every thread has read the logits before any overwrites them
    c00, c01, c02, c03 = _softmax4(c00, c01, c02, c03, hc_eps)
    c10, c11, c12, c13 = _softmax4(c10, c11, c12, c13, hc_eps)
    c20, c21, c22, c23 = _softmax4(c20, c21, c22, c23, hc_eps)
    c30, c31, c32, c33 = _softmax4(c30, c31, c32, c33, hc_eps)
    c00, c10, c20, c30 = _norm4(c00, c10, c20, c30, hc_eps)
    c01, c11, c21, c31 = _norm4(c01, c11, c21, c31, hc_eps)
    c02, c12, c22, c32 = _norm4(c02, c12, c22, c32, hc_eps)
    c03, c13, c23, c33 = _norm4(c03, c13, c23, c33, hc_eps)
    for _ in range(iters - 1):
        c00, c01, c02, c03 = _norm4(c00, c01, c02, c03, hc_eps)
        c10, c11, c12, c13 = _norm4(c10, c11, c12, c13, hc_eps)
        c20, c21, c22, c23 = _norm4(c20, c21, c22, c23, hc_eps)
        c30, c31, c32, c33 = _norm4(c30, c31, c32, c33, hc_eps)
        c00, c10, c20, c30 = _norm4(c00, c10, c20, c30, hc_eps)
        c01, c11, c21, c31 = _norm4(c01, c11, c21, c31, hc_eps)
        c02, c12, c22, c32 = _norm4(c02, c12, c22, c32, hc_eps)
        c03, c13, c23, c33 = _norm4(c03, c13, c23, c33, hc_eps)
    _store4(comb_ptr, c00, c01, c02, c03)
    _store4(comb_ptr + 4, c10, c11, c12, c13)
    _store4(comb_ptr + 8, c20, c21, c22, c23)
    _store4(comb_ptr + 12, c30, c31, c32, c33)


@triton.jit
def _hc_split_kernel(
    x_ptr, part_ptr, sq_ptr, scale_ptr, base_ptr, out_ptr, post_ptr, comb_ptr,
    T, N, D, M, n_split, stride_xt, stride_xn, stride_ot, iters, inv_k, hc_eps, norm_eps,
    HEAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NN: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    db = tl.program_id(1)
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    pre = _pre_gate(part_ptr, sq_ptr, scale_ptr, base_ptr, t, T, N, M, n_split, inv_k, hc_eps, norm_eps, BLOCK_N,
                    BLOCK_S, "")  # fmt: skip
    if not HEAD:
        if db == 0:
            _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, n_split, iters, inv_k,
                       hc_eps, norm_eps, BLOCK_N, BLOCK_NN, BLOCK_S, "", False)  # fmt: skip
    d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    x = tl.load(
        x_ptr + t * stride_xt + n[:, None] * stride_xn + d[None, :], mask=nm[:, None] & dm[None, :], other=0.0
    )
    y = tl.sum(x.to(tl.float32) * pre[:, None], axis=0)
    tl.store(out_ptr + t * stride_ot + d, y.to(out_ptr.dtype.element_ty), mask=dm)


def mixes_partials(x: torch.Tensor, fn: torch.Tensor):
    """Launch 1: split-K partials ``part [S, T, M]`` and ``sq [S, T]``."""
    T, N, D = x.shape
    K, M = N * D, fn.shape[0]
    fn = fn.float().contiguous()
    cfg = dispatch.hc_mixes_config(T, K, M)
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.splits), cfg.block_k) * cfg.block_k
    n_split = triton.cdiv(K, k_per_split)
    part = torch.empty((n_split, T, M), dtype=torch.float32, device=x.device)
    sq = torch.empty((n_split, T), dtype=torch.float32, device=x.device)
    _hc_mixes_kernel[(triton.cdiv(T, cfg.block_t), n_split)](
        x, fn, part, sq, T, K, M, k_per_split, x.stride(0), fn.stride(0),
        BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k, BLOCK_M=pow2(M, 16), DOT=cfg.dot, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **dispatch.pdl_args(T),
    )  # fmt: skip
    return part, sq


def _collapse(x, fn, base, scale, iters: int, hc_eps: float, norm_eps: float, head: bool):
    T, N, D = x.shape
    part, sq = mixes_partials(x, fn)
    dev = x.device
    out = torch.empty((T, D), dtype=x.dtype, device=dev)
    post = torch.empty((T, N), dtype=torch.float32, device=dev)
    comb = torch.empty((T, N, N), dtype=torch.float32, device=dev)
    cfg = dispatch.hc_split_config(T, N, D)
    _hc_split_kernel[(T, triton.cdiv(D, cfg.block_d))](
        x, part, sq, scale.float().contiguous(), base.float().contiguous(), out, post, comb,
        T, N, D, fn.shape[0], part.shape[0], x.stride(0), x.stride(1), out.stride(0), iters, 1.0 / (N * D), hc_eps,
        norm_eps, HEAD=head, BLOCK_N=pow2(N), BLOCK_NN=pow2(N) ** 2, BLOCK_D=cfg.block_d,
        BLOCK_S=pow2(part.shape[0]), num_warps=cfg.num_warps, **dispatch.pdl_args(T),
    )  # fmt: skip
    return out, post, comb


def hc_pre(x, fn, base, scale, sinkhorn_iters: int, hc_eps: float, norm_eps: float):
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_pre`."""
    x = x.contiguous()
    T, N, D = x.shape
    if T == 0:
        f32 = {"dtype": torch.float32, "device": x.device}
        return x.new_empty((0, D)), torch.empty((0, N), **f32), torch.empty((0, N, N), **f32)
    return _collapse(x, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, head=False)


def hc_head(x, fn, base, scale, hc_eps: float, norm_eps: float) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_head`."""
    x = x.contiguous()
    if x.shape[0] == 0:
        return x.new_empty((0, x.shape[2]))
    return _collapse(x, fn, base, scale, 0, hc_eps, norm_eps, head=True)[0]


@triton.jit
def _hc_post_kernel(y_ptr, res_ptr, post_ptr, comb_ptr, out_ptr, N, D, stride_yt, stride_rt, stride_rn, stride_ot,
                    stride_on, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    PDL: tl.constexpr = False):  # fmt: skip
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    y = tl.load(y_ptr + t * stride_yt + d, mask=dm, other=0.0).to(tl.float32)
    r = tl.load(
        res_ptr + t * stride_rt + n[:, None] * stride_rn + d[None, :],
        mask=nm[:, None] & dm[None, :],
        other=0.0,
    )
    post = tl.load(post_ptr + t * N + n, mask=nm, other=0.0)
    comb = tl.load(
        comb_ptr + t * N * N + n[:, None] * N + n[None, :], mask=nm[:, None] & nm[None, :], other=0.0
    )
    mixed = tl.sum(comb[:, :, None] * r.to(tl.float32)[:, None, :], axis=0)
    out = post[:, None] * y[None, :] + mixed
    tl.store(out_ptr + t * stride_ot + n[:, None] * stride_on + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=nm[:, None] & dm[None, :])  # fmt: skip


def hc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_post`."""
    T, N, D = residual.shape
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    if T == 0:
        return out
    y = y if y.stride(-1) == 1 else y.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    cfg = dispatch.hc_rows_config(N, D)
    _hc_post_kernel[(T, triton.cdiv(D, cfg.block_d))](
        y, residual, post.float().contiguous(), comb.float().contiguous(), out, N, D,
        y.stride(0), residual.stride(0), residual.stride(1), out.stride(0), out.stride(1),
        BLOCK_N=pow2(N), BLOCK_D=cfg.block_d, num_warps=cfg.num_warps, **dispatch.pdl_args(T),
    )  # fmt: skip
    return out


@triton.jit
def _hc_fused_kernel(
    y_ptr, res_ptr, post_in_ptr, comb_in_ptr, h_ptr, fn_ptr, scale_ptr, base_ptr, w_ptr,
    part_ptr, sq_ptr, cnt_ptr, out_ptr, post_ptr, comb_ptr,
    T, N, D, M, P, stride_yt, stride_rt, stride_rn, stride_ht, stride_hn, stride_fn, stride_ot,
    iters, inv_k, hc_eps, norm_eps,
    POST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NN: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, TAIL_D: tl.constexpr, SINK4: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """One launch for a sublayer boundary, over ``(token, channel block)``. Each program (``POST``: first
    computes its channels of ``h = hc_post(y, residual, post_in, comb_in)`` for every stream, stores them in
    ``h`` rounded to its dtype and goes on with the rounded values; else reads them from ``h``) stores its
    partial mixes ``h[:, d] . fn[:, :, d]`` and ``sum h^2``, then counts itself in the token's counter. The
    last of the token's ``P`` programs to arrive (the :func:`_common.finish_split` pattern) sums the partials
    and runs the rest: gates, Sinkhorn, the collapse of ``h`` (its loads issued before the Sinkhorn loop)
    rounded to ``h``'s dtype as ``hc_pre`` returns it, then the weighted RMSNorm, and zeroes the counter."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    d = p * BLOCK_D + tl.arange(0, BLOCK_D)
    xm = nm[:, None] & (d < D)[None, :]
    h_off = t * stride_ht + n[:, None] * stride_hn + d[None, :]
    m = tl.arange(0, BLOCK_M)
    mm = m < M
    # fn's slice first: in program order after the store of h it could not be loaded before h is computed
    f = tl.load(fn_ptr + m[:, None, None] * stride_fn + (n[:, None] * D + d[None, :])[None, :, :],
                mask=mm[:, None, None] & xm[None, :, :], other=0.0)  # fmt: skip
    if POST:
        yv = tl.load(y_ptr + t * stride_yt + d, mask=d < D, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + t * stride_rt + n[:, None] * stride_rn + d[None, :], mask=xm, other=0.0)
        post_in = tl.load(post_in_ptr + t * N + n, mask=nm, other=0.0)
        comb_in = tl.load(
            comb_in_ptr + t * N * N + n[:, None] * N + n[None, :], mask=nm[:, None] & nm[None, :], other=0.0
        )
        mixed = tl.sum(comb_in[:, :, None] * r.to(tl.float32)[:, None, :], axis=0)
        hv = (post_in[:, None] * yv[None, :] + mixed).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + h_off, hv, mask=xm)
        x = hv.to(tl.float32)
    else:
        x = tl.load(h_ptr + h_off, mask=xm, other=0.0).to(tl.float32)
    part = tl.sum(tl.sum(f * x[None, :, :], axis=2), axis=1)
    tl.store(part_ptr + (p * T + t) * M + m, part, mask=mm)
    tl.store(sq_ptr + p * T + t, tl.sum(tl.sum(x * x, axis=1), axis=0))
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    if arrived == P - 1:
        pre = _pre_gate(part_ptr, sq_ptr, scale_ptr, base_ptr, t, T, N, M, P, inv_k, hc_eps, norm_eps, BLOCK_N,
                        BLOCK_P, ".cg")  # fmt: skip
        dd = tl.arange(0, TAIL_D)
        if TAIL_D >= D:  # the whole row at once: its loads go out before the Sinkhorn loop
            hm = nm[:, None] & (dd < D)[None, :]
            hs = tl.load(h_ptr + t * stride_ht + n[:, None] * stride_hn + dd[None, :], mask=hm, other=0.0,
                         cache_modifier=".cg")  # fmt: skip
            w = tl.load(w_ptr + dd, mask=dd < D, other=0.0)
            _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, P, iters, inv_k,
                       hc_eps, norm_eps, BLOCK_N, BLOCK_NN, BLOCK_P, ".cg", SINK4)  # fmt: skip
            c = tl.sum(hs.to(tl.float32) * pre[:, None], axis=0).to(h_ptr.dtype.element_ty).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=0) / D + norm_eps)
            tl.store(out_ptr + t * stride_ot + dd, (c * rstd * w).to(out_ptr.dtype.element_ty), mask=dd < D)
        else:  # two passes over channel chunks: the sum of squares, then the normed collapse
            _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, P, iters, inv_k,
                       hc_eps, norm_eps, BLOCK_N, BLOCK_NN, BLOCK_P, ".cg", SINK4)  # fmt: skip
            acc = tl.zeros([TAIL_D], dtype=tl.float32)
            for d0 in range(0, D, TAIL_D):
                hm = nm[:, None] & (d0 + dd < D)[None, :]
                hs = tl.load(h_ptr + t * stride_ht + n[:, None] * stride_hn + d0 + dd[None, :], mask=hm,
                             other=0.0, cache_modifier=".cg")  # fmt: skip
                c = tl.sum(hs.to(tl.float32) * pre[:, None], axis=0).to(h_ptr.dtype.element_ty).to(tl.float32)
                acc += c * c
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + norm_eps)
            for d0 in range(0, D, TAIL_D):
                hm = nm[:, None] & (d0 + dd < D)[None, :]
                hs = tl.load(h_ptr + t * stride_ht + n[:, None] * stride_hn + d0 + dd[None, :], mask=hm,
                             other=0.0, cache_modifier=".cg")  # fmt: skip
                c = tl.sum(hs.to(tl.float32) * pre[:, None], axis=0).to(h_ptr.dtype.element_ty).to(tl.float32)
                w = tl.load(w_ptr + d0 + dd, mask=d0 + dd < D, other=0.0)
                tl.store(out_ptr + t * stride_ot + d0 + dd, (c * rstd * w).to(out_ptr.dtype.element_ty),
                         mask=d0 + dd < D)  # fmt: skip
        tl.atomic_xchg(cnt_ptr + t, 0)


def _fused(
    y, residual, post, comb, h, fn, base, scale, weight, iters: int, hc_eps: float, norm_eps: float, cfg
):
    """Launch :func:`_hc_fused_kernel`; ``y is None``: ``h`` is the input streams (``hc_pre_norm``), else ``h``
    is written (``hc_post_pre``). -> ``(normed [T, D], post [T, N], comb [T, N, N])``."""
    T, N, D = h.shape
    M = fn.shape[0]
    P = triton.cdiv(D, cfg.block_d)
    dev = h.device
    f32 = {"dtype": torch.float32, "device": dev}
    part, sq = torch.empty((P, T, M), **f32), torch.empty((P, T), **f32)
    out = torch.empty((T, D), dtype=h.dtype, device=dev)
    post_out, comb_out = torch.empty((T, N), **f32), torch.empty((T, N, N), **f32)
    post_in, y_, res = (post, y, residual) if y is not None else (post_out, h, h)
    _hc_fused_kernel[(T, P)](
        y_, res, post_in.float().contiguous() if y is not None else post_out,
        comb.float().contiguous() if y is not None else comb_out, h, fn.float().contiguous(),
        scale.float().contiguous(), base.float().contiguous(), weight.float().contiguous(), part, sq,
        arrival_counters(dev), out, post_out, comb_out,
        T, N, D, M, P, y_.stride(0), res.stride(0), res.stride(1), h.stride(0), h.stride(1), fn.stride(0),
        out.stride(0), iters, 1.0 / (N * D), hc_eps, norm_eps,
        POST=y is not None, BLOCK_N=pow2(N), BLOCK_NN=pow2(N) ** 2, BLOCK_M=pow2(M), BLOCK_D=cfg.block_d,
        BLOCK_P=pow2(P), TAIL_D=cfg.tail_d, SINK4=N == 4, num_warps=cfg.num_warps, **dispatch.pdl_args(T),
    )  # fmt: skip
    return out, post_out, comb_out


def hc_pre_norm(x, fn, base, scale, sinkhorn_iters: int, hc_eps: float, norm_eps: float, weight):
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_pre_norm`; ``None`` where
    :func:`dispatch.hc_fused_config` leaves it to ``hc_pre`` and ``rms_norm``."""
    T, N, D = x.shape
    cfg = dispatch.hc_fused_config(T, N, D, fn.shape[0])
    if cfg is None:
        return None
    return _fused(None, None, None, None, x.contiguous(), fn, base, scale, weight, sinkhorn_iters, hc_eps,
                  norm_eps, cfg)  # fmt: skip


def hc_post_pre(y, residual, post, comb, fn, base, scale, sinkhorn_iters: int, hc_eps: float, norm_eps: float,
                weight):  # fmt: skip
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_post_pre`; ``None`` where
    :func:`dispatch.hc_fused_config` leaves it to ``hc_post`` and ``hc_pre_norm``."""
    T, N, D = residual.shape
    cfg = dispatch.hc_fused_config(T, N, D, fn.shape[0])
    if cfg is None:
        return None
    y = y if y.stride(-1) == 1 else y.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    h = torch.empty((T, N, D), dtype=residual.dtype, device=residual.device)
    return (
        h,
        *_fused(y, residual, post, comb, h, fn, base, scale, weight, sinkhorn_iters, hc_eps, norm_eps, cfg),
    )
