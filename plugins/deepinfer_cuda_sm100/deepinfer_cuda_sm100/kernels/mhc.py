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

At decode a sublayer boundary, ``hc_post`` then the next ``hc_pre`` and its RMSNorm, is two launches instead of four
(:mod:`deepinfer_cuda_sm100.kernels.mhc_boundary`, which reuses this module's coefficient helpers).
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
