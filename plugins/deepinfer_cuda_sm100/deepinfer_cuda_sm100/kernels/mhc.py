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

V4.1's single-pass mHC splits ``hc_pre`` differently: ``hc_mixes`` (the same coefficients, nothing collapsed) is
launch 1 and ``_hc_coeffs_kernel`` (one program per token: ``pre``, ``post`` and the Sinkhorn ``comb``), and
``hc_collapse`` (``sum_n pre[n] x[n]`` with the ``pre`` of the site before) is one launch.

At decode (up to ``dispatch.HC_FUSED_MAX_TOKENS`` tokens) a sublayer boundary, ``hc_post`` then the next
``hc_pre`` and its RMSNorm, is two launches instead of four: ``_hc_boundary_mix_kernel`` (``hc_post``'s work
inside the mixes' split over channels, plus the streams' Gram partials) and ``_hc_collapse_norm_kernel``
(the split kernel's work, its collapse normed through the Gram matrix). V4.1's site entry there collapses by the
site before's ``pre`` and adds ``_hc_coeffs_kernel`` for its own coefficients, after the collapse or beside it on a
side stream (``settings.hc_side_coeffs``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import side_branch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pow2


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
def _load_mix(part_ptr, sq_ptr, offs, mask, t, T, M, n_split, rstd_k, eps, BLOCK_S: tl.constexpr):
    """Sum the split-K partials of mixes ``offs`` (1-D) of token ``t`` and apply the RMSNorm scalar. All
    splits are one ``[BLOCK_S, len(offs)]`` load, so the sum costs one memory latency, not one per split."""
    s = tl.arange(0, BLOCK_S)
    sm = s < n_split
    acc = tl.load(
        part_ptr + ((s * T + t) * M)[:, None] + offs[None, :],
        mask=sm[:, None] & mask[None, :],
        other=0.0,
    )
    sq = tl.sum(tl.load(sq_ptr + s * T + t, mask=sm, other=0.0), axis=0)
    return tl.sum(acc, axis=0) / tl.sqrt(sq * rstd_k + eps)


@triton.jit
def _pre_gate(part_ptr, sq_ptr, scale_ptr, base_ptr, t, T, N, M, n_split, inv_k, hc_eps, norm_eps,
              BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    """``pre = sigmoid(mix * scale[0] + base) + hc_eps`` of token ``t`` -> ``[BLOCK_N]``."""
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    pre_l = _load_mix(part_ptr, sq_ptr, n, nm, t, T, M, n_split, inv_k, norm_eps, BLOCK_S)
    return tl.sigmoid(pre_l * tl.load(scale_ptr) + tl.load(base_ptr + n, mask=nm, other=0.0)) + hc_eps


@triton.jit
def _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, n_split, iters, inv_k,
               hc_eps, norm_eps, BLOCK_N: tl.constexpr, BLOCK_NN: tl.constexpr, BLOCK_S: tl.constexpr,
               ):  # fmt: skip
    """Store token ``t``'s ``post = 2 sigmoid(.)`` and ``comb``, the Sinkhorn-Knopp projection of
    ``softmax(.) + hc_eps`` (``iters`` column/row normalisations, columns first), computed in registers: in one
    warp its sums stay in each thread (more warps would reduce through shared memory, a barrier each)."""
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    post_l = _load_mix(part_ptr, sq_ptr, N + n, nm, t, T, M, n_split, inv_k, norm_eps, BLOCK_S)
    post_l = post_l * tl.load(scale_ptr + 1) + tl.load(base_ptr + N + n, mask=nm, other=0.0)
    tl.store(post_ptr + t * N + n, 2.0 * tl.sigmoid(post_l), mask=nm)
    cm = nm[:, None] & nm[None, :]
    jk = n[:, None] * N + n[None, :]
    c = _load_mix(part_ptr, sq_ptr, tl.reshape(2 * N + jk, [BLOCK_NN]), tl.reshape(cm, [BLOCK_NN]), t, T, M,
                  n_split, inv_k, norm_eps, BLOCK_S)  # fmt: skip
    c = tl.reshape(c, [BLOCK_N, BLOCK_N]) * tl.load(scale_ptr + 2)
    c = tl.where(cm, c + tl.load(base_ptr + 2 * N + jk, mask=cm, other=0.0), float("-inf"))
    c = tl.exp(c - tl.max(c, axis=1)[:, None])
    c = tl.where(cm, c / tl.sum(c, axis=1)[:, None] + hc_eps, 0.0)
    c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    for _ in range(iters - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    tl.store(comb_ptr + t * N * N + jk, c, mask=cm)


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
                    BLOCK_S)  # fmt: skip
    if not HEAD:
        if db == 0:
            _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, n_split, iters, inv_k,
                       hc_eps, norm_eps, BLOCK_N, BLOCK_NN, BLOCK_S)  # fmt: skip
    d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    x = tl.load(
        x_ptr + t * stride_xt + n[:, None] * stride_xn + d[None, :], mask=nm[:, None] & dm[None, :], other=0.0
    )
    y = tl.sum(x.to(tl.float32) * pre[:, None], axis=0)
    tl.store(out_ptr + t * stride_ot + d, y.to(out_ptr.dtype.element_ty), mask=dm)


def mixes_partials(x: torch.Tensor, fn: torch.Tensor, forked: bool = False):
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
        num_stages=cfg.num_stages, **dispatch.pdl_args(T, forked),
    )  # fmt: skip
    return part, sq


def _collapse(x, fn, base, scale, iters: int, hc_eps: float, norm_eps: float, head: bool, forked: bool):
    T, N, D = x.shape
    part, sq = mixes_partials(x, fn, forked)
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


@triton.jit
def _hc_coeffs_kernel(
    part_ptr, sq_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr,
    T, N, M, n_split, iters, inv_k, hc_eps, norm_eps,
    BLOCK_N: tl.constexpr, BLOCK_NN: tl.constexpr, BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Token ``program_id(0)``'s ``pre``, ``post`` and ``comb`` from the mixes' partials (V4.1's ``hc_mixes``)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK_N)
    pre = _pre_gate(part_ptr, sq_ptr, scale_ptr, base_ptr, t, T, N, M, n_split, inv_k, hc_eps, norm_eps, BLOCK_N,
                    BLOCK_S)  # fmt: skip
    tl.store(pre_ptr + t * N + n, pre, mask=n < N)
    _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, n_split, iters, inv_k,
               hc_eps, norm_eps, BLOCK_N, BLOCK_NN, BLOCK_S)  # fmt: skip


def hc_mixes(x, fn, base, scale, sinkhorn_iters: int, hc_eps: float, norm_eps: float):
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_mixes`: two launches, all tokens at once."""
    forked = side_branch.join(x.device)
    x = x.contiguous()
    T, N, D = x.shape
    f32 = {"dtype": torch.float32, "device": x.device}
    pre, post, comb = torch.empty((T, N), **f32), torch.empty((T, N), **f32), torch.empty((T, N, N), **f32)
    if T == 0:
        return pre, post, comb
    part, sq = mixes_partials(x, fn, forked)
    _hc_coeffs_kernel[(T,)](
        part, sq, scale.float().contiguous(), base.float().contiguous(), pre, post, comb,
        T, N, fn.shape[0], part.shape[0], sinkhorn_iters, 1.0 / (N * D), hc_eps, norm_eps,
        BLOCK_N=pow2(N), BLOCK_NN=pow2(N) ** 2, BLOCK_S=pow2(part.shape[0]), num_warps=1, **dispatch.pdl_args(T),
    )  # fmt: skip
    return pre, post, comb


@triton.jit
def _hc_collapse_kernel(x_ptr, pre_ptr, out_ptr, N, D, stride_xt, stride_xn, stride_ot,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """``out[t, d] = sum_n pre[t, n] * x[t, n, d]`` in float32, for token ``program_id(0)`` and one channel block."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    pre = tl.load(pre_ptr + t * N + n, mask=nm, other=0.0)
    x = tl.load(x_ptr + t * stride_xt + n[:, None] * stride_xn + d[None, :], mask=nm[:, None] & dm[None, :],
                other=0.0)  # fmt: skip
    y = tl.sum(x.to(tl.float32) * pre[:, None], axis=0)
    tl.store(out_ptr + t * stride_ot + d, y.to(out_ptr.dtype.element_ty), mask=dm)


def hc_collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_collapse`: one launch."""
    forked = side_branch.join(x.device)
    x = x.contiguous()
    T, N, D = x.shape
    out = torch.empty((T, D), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    cfg = dispatch.hc_split_config(T, N, D)
    _hc_collapse_kernel[(T, triton.cdiv(D, cfg.block_d))](
        x, pre.float().contiguous(), out, N, D, x.stride(0), x.stride(1), out.stride(0),
        BLOCK_N=pow2(N), BLOCK_D=cfg.block_d, num_warps=cfg.num_warps, **dispatch.pdl_args(T, forked),
    )  # fmt: skip
    return out


def hc_pre(x, fn, base, scale, sinkhorn_iters: int, hc_eps: float, norm_eps: float):
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_pre`."""
    forked = side_branch.join(x.device)
    x = x.contiguous()
    T, N, D = x.shape
    if T == 0:
        f32 = {"dtype": torch.float32, "device": x.device}
        return x.new_empty((0, D)), torch.empty((0, N), **f32), torch.empty((0, N, N), **f32)
    return _collapse(x, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, head=False, forked=forked)


def hc_head(x, fn, base, scale, hc_eps: float, norm_eps: float) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.dense.DenseOps.hc_head`."""
    forked = side_branch.join(x.device)
    x = x.contiguous()
    if x.shape[0] == 0:
        return x.new_empty((0, x.shape[2]))
    return _collapse(x, fn, base, scale, 0, hc_eps, norm_eps, head=True, forked=forked)[0]


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
    forked = side_branch.join(residual.device)
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
        BLOCK_N=pow2(N), BLOCK_D=cfg.block_d, num_warps=cfg.num_warps, **dispatch.pdl_args(T, forked),
    )  # fmt: skip
    return out


@triton.jit
def _hc_boundary_mix_kernel(
    y_ptr, res_ptr, post_in_ptr, comb_in_ptr, h_ptr, fn_ptr, part_ptr, sq_ptr, gram_ptr,
    T, N, D, M, stride_yt, stride_rt, stride_rn, stride_ht, stride_hn, stride_fn,
    POST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Launch 1 of a sublayer boundary, over ``(token, channel block)``: ``POST``: ``h = hc_post(y, residual,
    post_in, comb_in)`` for its channels of every stream, stored rounded to ``h``'s dtype (else ``h`` is read);
    then the partials, over those channels, of the mixes ``h . fn``, of ``sum h^2`` and of the streams' Gram
    matrix ``G[i, j] = sum_d h[i, d] h[j, d]``, from which launch 2 gets the norm of the collapse."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    d = p * BLOCK_D + tl.arange(0, BLOCK_D)
    xm = nm[:, None] & (d < D)[None, :]
    m = tl.arange(0, BLOCK_M)
    mm = m < M
    # fn's slice first: in program order after the store of h it could not be loaded before h is computed
    f = tl.load(fn_ptr + m[:, None, None] * stride_fn + (n[:, None] * D + d[None, :])[None, :, :],
                mask=mm[:, None, None] & xm[None, :, :], other=0.0)  # fmt: skip
    h_off = t * stride_ht + n[:, None] * stride_hn + d[None, :]
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
    tl.store(part_ptr + (p * T + t) * M + m, tl.sum(tl.sum(f * x[None, :, :], axis=2), axis=1), mask=mm)
    tl.store(sq_ptr + p * T + t, tl.sum(tl.sum(x * x, axis=1), axis=0))
    g = tl.sum(x[:, None, :] * x[None, :, :], axis=2)
    jk = n[:, None] * BLOCK_N + n[None, :]
    tl.store(gram_ptr + (p * T + t) * BLOCK_N * BLOCK_N + jk, g)


@triton.jit
def _hc_collapse_norm_kernel(
    h_ptr, part_ptr, sq_ptr, gram_ptr, scale_ptr, base_ptr, w_ptr, out_ptr, post_ptr, comb_ptr, pre_in_ptr,
    T, N, D, M, P, stride_ht, stride_hn, stride_ot, iters, inv_k, hc_eps, norm_eps,
    BLOCK_N: tl.constexpr, BLOCK_NN: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
    PRE_IN: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """Launch 2, over ``(token, channel block)``, as ``_hc_split_kernel`` (its first block also stores
    ``post`` and ``comb``), except that it writes the collapse already normed: ``sum_d c[d]^2`` of the collapse
    ``c = pre . h`` is ``pre^T G pre``, from launch 1's Gram partials, so no program needs the whole row. (The
    square sum is of ``c`` before its rounding to ``h``'s dtype, which the separate ops would norm: exact in
    float32, a relative difference of order 1e-5 in the norm in bf16.) ``PRE_IN`` (V4.1's single pass): the
    collapse is by ``pre_in`` (the site before's), and the site's own ``pre``, ``post`` and ``comb`` are left to
    ``_hc_coeffs_kernel`` (:func:`_site_coeffs`)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    db = tl.program_id(1)
    n = tl.arange(0, BLOCK_N)
    nm = n < N
    if PRE_IN:
        pre = tl.load(pre_in_ptr + t * N + n, mask=nm, other=0.0)
    else:
        pre = _pre_gate(part_ptr, sq_ptr, scale_ptr, base_ptr, t, T, N, M, P, inv_k, hc_eps, norm_eps, BLOCK_N,
                        BLOCK_P)  # fmt: skip
    s = tl.arange(0, BLOCK_P)
    jk = tl.arange(0, BLOCK_NN)
    g = tl.load(gram_ptr + ((s * T + t) * BLOCK_NN)[:, None] + jk[None, :], mask=(s < P)[:, None], other=0.0)
    g = tl.reshape(tl.sum(g, axis=0), [BLOCK_N, BLOCK_N])
    pre0 = tl.where(nm, pre, 0.0)
    ss = tl.sum(tl.sum(g * pre0[:, None] * pre0[None, :], axis=1), axis=0)
    rstd = 1.0 / tl.sqrt(ss / D + norm_eps)
    if not PRE_IN and db == 0:
        _post_comb(part_ptr, sq_ptr, scale_ptr, base_ptr, post_ptr, comb_ptr, t, T, N, M, P, iters, inv_k, hc_eps,
                   norm_eps, BLOCK_N, BLOCK_NN, BLOCK_P)  # fmt: skip
    d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    x = tl.load(
        h_ptr + t * stride_ht + n[:, None] * stride_hn + d[None, :], mask=nm[:, None] & dm[None, :], other=0.0
    )
    c = tl.sum(x.to(tl.float32) * pre[:, None], axis=0).to(h_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + d, (c * rstd * w).to(out_ptr.dtype.element_ty), mask=dm)


def _site_coeffs(
    part,
    sq,
    scale,
    base,
    pre,
    post,
    comb,
    iters: int,
    inv_k: float,
    hc_eps: float,
    norm_eps: float,
    side: bool,
):
    """A V4.1 site's own ``pre``, ``post`` and ``comb`` (``_hc_coeffs_kernel``, the Sinkhorn's dependent steps
    among them), read at the next site only. ``side``: on a side branch forked after launch 1 and joined at the
    next mHC op, so the collapse, and the sublayer after it, need not wait for them (``settings.hc_side_coeffs``);
    else in line after the collapse. One kernel either way, so the two give the same bits (inside the collapse,
    the same arithmetic compiled in another context gave others: NOTES.md v35)."""
    T, N = pre.shape
    held = (part, sq, scale, base, pre, post, comb)
    args = (*held, T, N, part.shape[2], part.shape[0], iters, inv_k, hc_eps, norm_eps)
    meta = {"BLOCK_N": pow2(N), "BLOCK_NN": pow2(N) ** 2, "BLOCK_S": pow2(part.shape[0]), "num_warps": 1}
    if not side:
        _hc_coeffs_kernel[(T,)](*args, **meta, **dispatch.pdl_args(T))
        return
    side_branch.fork(
        part.device, lambda: _hc_coeffs_kernel[(T,)](*args, **meta, **dispatch.pdl_args(T, forked=True)), held
    )


def _boundary(
    y, residual, post, comb, h, fn, base, scale, weight, iters: int, hc_eps: float, norm_eps: float, cfg,
    pre_in=None,
):  # fmt: skip
    """The two launches; ``y is None``: ``h`` holds the input streams (``hc_pre_norm``), else they are written
    to it (``hc_post_pre``). -> ``(normed [T, D], post [T, N], comb [T, N, N])``; with ``pre_in`` (V4.1: the
    collapse by the site before's ``pre``) ``(normed, pre [T, N], post, comb)``, ``pre`` the site's own."""
    forked = side_branch.join(h.device)
    T, N, D = h.shape
    M = fn.shape[0]
    P = triton.cdiv(D, cfg.block_d)
    BN = pow2(N)
    dev = h.device
    f32 = {"dtype": torch.float32, "device": dev}
    part, sq, gram = (
        torch.empty((P, T, M), **f32),
        torch.empty((P, T), **f32),
        torch.empty((P, T, BN * BN), **f32),
    )
    out = torch.empty((T, D), dtype=h.dtype, device=dev)
    post_out, comb_out = torch.empty((T, N), **f32), torch.empty((T, N, N), **f32)
    fn = fn.float().contiguous()
    if y is not None:
        post_in, comb_in, y_, res = post.float().contiguous(), comb.float().contiguous(), y, residual
    else:
        post_in, comb_in, y_, res = post_out, comb_out, h, h  # not read
    _hc_boundary_mix_kernel[(T, P)](
        y_, res, post_in, comb_in, h, fn, part, sq, gram,
        T, N, D, M, y_.stride(0), res.stride(0), res.stride(1), h.stride(0), h.stride(1), fn.stride(0),
        POST=y is not None, BLOCK_N=BN, BLOCK_M=pow2(M), BLOCK_D=cfg.block_d, num_warps=cfg.num_warps,
        **dispatch.pdl_args(T, forked),
    )  # fmt: skip
    pre_out = torch.empty((T, N), **f32) if pre_in is not None else post_out  # (not written without pre_in)
    pre_in = pre_in.float().contiguous() if pre_in is not None else None
    scale, base = scale.float().contiguous(), base.float().contiguous()
    inv_k = 1.0 / (N * D)
    # V4.1: the site's own coefficients are read at the next site only, so off the collapse's critical path
    coeffs = (part, sq, scale, base, pre_out, post_out, comb_out, iters, inv_k, hc_eps, norm_eps)
    side = pre_in is not None and dispatch.hc_side_coeffs(h.device)
    if side:
        _site_coeffs(*coeffs, side=True)
    _hc_collapse_norm_kernel[(T, triton.cdiv(D, cfg.norm_block_d))](
        h, part, sq, gram, scale, base, weight.contiguous(), out,
        post_out, comb_out, pre_in if pre_in is not None else post_out, T, N, D, M, P, h.stride(0),
        h.stride(1), out.stride(0), iters, inv_k, hc_eps, norm_eps, BLOCK_N=BN, BLOCK_NN=BN * BN,
        BLOCK_D=cfg.norm_block_d, BLOCK_P=pow2(P), PRE_IN=pre_in is not None, num_warps=cfg.norm_warps,
        **dispatch.pdl_args(T),
    )  # fmt: skip
    if pre_in is not None:
        if not side:
            _site_coeffs(*coeffs, side=False)
        return out, pre_out, post_out, comb_out
    return out, post_out, comb_out


def hc_pre_norm(x, fn, base, scale, sinkhorn_iters: int, hc_eps: float, norm_eps: float, weight, pre_in=None):
    """The fused ``compose_hc_pre_norm`` (plugin API), or with ``pre_in`` ``compose_hc_site_norm`` (2.6, V4.1: the
    collapse by the site before's ``pre``); ``None`` where :func:`dispatch.hc_fused_config` leaves it to the
    separate ops."""
    T, N, D = x.shape
    cfg = dispatch.hc_fused_config(T, N, D, fn.shape[0])
    if cfg is None:
        return None
    return _boundary(None, None, None, None, x.contiguous(), fn, base, scale, weight, sinkhorn_iters, hc_eps,
                     norm_eps, cfg, pre_in)  # fmt: skip


def hc_post_pre(y, residual, post, comb, fn, base, scale, sinkhorn_iters: int, hc_eps: float, norm_eps: float,
                weight, pre_in=None):  # fmt: skip
    """The fused ``compose_hc_post_pre`` (plugin API), or with ``pre_in`` ``compose_hc_post_site_norm`` (2.6,
    V4.1); ``None`` where :func:`dispatch.hc_fused_config` leaves it to the separate ops."""
    T, N, D = residual.shape
    cfg = dispatch.hc_fused_config(T, N, D, fn.shape[0])
    if cfg is None:
        return None
    y = y if y.stride(-1) == 1 else y.contiguous()
    residual = residual if residual.stride(-1) == 1 else residual.contiguous()
    h = torch.empty((T, N, D), dtype=residual.dtype, device=residual.device)
    return (h, *_boundary(y, residual, post, comb, h, fn, base, scale, weight, sinkhorn_iters, hc_eps, norm_eps,
                          cfg, pre_in))  # fmt: skip
