"""A sublayer boundary's mHC in two launches at decode (up to ``dispatch.HC_FUSED_MAX_TOKENS`` tokens) on the
critical path: ``hc_post`` then the next ``hc_pre`` and its RMSNorm, instead of four. ``_hc_boundary_mix_kernel``
does ``hc_post``'s work inside the mixes' split over channels, plus the streams' Gram partials;
``_hc_collapse_norm_kernel`` collapses the streams (by the ``pre`` gate, or V4.1's site entry by the site before's
``pre``) and norms the collapse through the Gram matrix. The coefficients the next boundary reads (``post`` and the
Sinkhorn's ``comb``; V4.1's own ``pre`` too) come from a third launch, ``mhc._hc_coeffs_kernel``, beside the
collapse on a side stream (``settings.hc_side_coeffs``) or after it, the same bits either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import mhc, side_branch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pow2
from deepinfer_cuda_sm100.kernels.mhc import _pre_gate


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
    h_ptr, part_ptr, sq_ptr, gram_ptr, scale_ptr, base_ptr, w_ptr, out_ptr, pre_in_ptr,
    T, N, D, M, P, stride_ht, stride_hn, stride_ot, inv_k, hc_eps, norm_eps,
    BLOCK_N: tl.constexpr, BLOCK_NN: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
    PRE_IN: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """Launch 2, over ``(token, channel block)``: the collapse of ``_hc_split_kernel`` by the ``pre`` gate,
    written already normed: ``sum_d c[d]^2`` of the collapse ``c = pre . h`` is ``pre^T G pre``, from launch 1's
    Gram partials, so no program needs the whole row. (The square sum is of ``c`` before its rounding to ``h``'s
    dtype, which the separate ops would norm: exact in float32, a relative difference of order 1e-5 in the norm in
    bf16.) ``PRE_IN`` (V4.1's single pass): the collapse is by ``pre_in`` (the site before's). ``post`` and
    ``comb`` (and V4.1's own ``pre``) are ``_hc_coeffs_kernel``'s (:func:`_site_coeffs`), so no program of this one
    waits for the Sinkhorn's dependent steps."""
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
    """A boundary's ``post`` and ``comb`` and V4.1's site's own ``pre`` (``mhc._hc_coeffs_kernel``, the Sinkhorn's
    dependent steps among them; V4's ``pre`` output is a scratch), read at the next boundary only. ``side``: on a
    side branch forked after launch 1 and joined at the next mHC op, so the collapse, and the sublayer after it,
    need not wait for them (``settings.hc_side_coeffs``); else in line after the collapse. One kernel either way, so the two give the same bits (inside the collapse,
    the same arithmetic compiled in another context gave others: NOTES.md v35)."""
    T, N = pre.shape
    held = (part, sq, scale, base, pre, post, comb)
    args = (*held, T, N, part.shape[2], part.shape[0], iters, inv_k, hc_eps, norm_eps)
    meta = {"BLOCK_N": pow2(N), "BLOCK_NN": pow2(N) ** 2, "BLOCK_S": pow2(part.shape[0]), "num_warps": 1}
    if not side:
        mhc._hc_coeffs_kernel[(T,)](*args, **meta, **dispatch.pdl_args(T))
        return
    side_branch.fork(
        part.device,
        lambda: mhc._hc_coeffs_kernel[(T,)](*args, **meta, **dispatch.pdl_args(T, forked=True)),
        held,
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
    # V4.1: the site's own pre; V4: not returned (the collapse gates its own)
    pre_out = torch.empty((T, N), **f32)
    pre_in = pre_in.float().contiguous() if pre_in is not None else None
    scale, base = scale.float().contiguous(), base.float().contiguous()
    inv_k = 1.0 / (N * D)
    # the coefficients are read at the next boundary only, so off the collapse's critical path
    coeffs = (part, sq, scale, base, pre_out, post_out, comb_out, iters, inv_k, hc_eps, norm_eps)
    side = dispatch.hc_side_coeffs(h.device)
    if side:
        _site_coeffs(*coeffs, side=True)
    _hc_collapse_norm_kernel[(T, triton.cdiv(D, cfg.norm_block_d))](
        h, part, sq, gram, scale, base, weight.contiguous(), out, pre_in if pre_in is not None else pre_out,
        T, N, D, M, P, h.stride(0), h.stride(1), out.stride(0), inv_k, hc_eps, norm_eps, BLOCK_N=BN,
        BLOCK_NN=BN * BN, BLOCK_D=cfg.norm_block_d, BLOCK_P=pow2(P), PRE_IN=pre_in is not None,
        num_warps=cfg.norm_warps, **dispatch.pdl_args(T),
    )  # fmt: skip
    if not side:
        _site_coeffs(*coeffs, side=False)
    if pre_in is not None:
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
