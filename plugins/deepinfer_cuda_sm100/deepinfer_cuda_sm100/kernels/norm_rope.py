"""RMSNorm over rows and interleaved partial RoPE over ``[T, H, D]`` (both memory-bound, one pass)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, D, stride_x, stride_o, eps, HAS_W: tl.constexpr, BLOCK_D: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        m = d0 + cols < D
        x = tl.load(x_ptr + row * stride_x + d0 + cols, mask=m, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)
    for d0 in range(0, D, BLOCK_D):
        m = d0 + cols < D
        y = tl.load(x_ptr + row * stride_x + d0 + cols, mask=m, other=0.0).to(tl.float32) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + d0 + cols, mask=m, other=0.0)
        tl.store(out_ptr + row * stride_o + d0 + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in float32; result in ``x.dtype``."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0] == 0:
        return out.view(x.shape)
    cfg = dispatch.rows_config(D)
    w = weight.float().contiguous() if weight is not None else x2
    _rms_norm_kernel[(x2.shape[0],)](
        x2, w, out, D, x2.stride(0), out.stride(0), eps,
        HAS_W=weight is not None, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps,
    )  # fmt: skip
    return out.view(x.shape)


@triton.jit
def _rope_kernel(
    x_ptr, pos_ptr, freq_ptr, out_ptr,
    H, D, R2, stride_xt, stride_xh, stride_ot, stride_oh,
    SIGN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_NOPE: tl.constexpr, BLOCK_R2: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = heads < H
    x_row = x_ptr + t * stride_xt + heads[:, None] * stride_xh
    o_row = out_ptr + t * stride_ot + heads[:, None] * stride_oh
    nope = D - 2 * R2
    cols = tl.arange(0, BLOCK_NOPE)
    for c0 in range(0, nope, BLOCK_NOPE):
        m = hm[:, None] & (c0 + cols < nope)[None, :]
        tl.store(o_row + c0 + cols[None, :], tl.load(x_row + c0 + cols[None, :], mask=m), mask=m)
    i = tl.arange(0, BLOCK_R2)
    im = i < R2
    ang = tl.load(pos_ptr + t).to(tl.float32) * tl.load(freq_ptr + i, mask=im, other=0.0)
    c = tl.cos(ang)[None, :]
    s = SIGN * tl.sin(ang)[None, :]
    m = hm[:, None] & im[None, :]
    ev = tl.load(x_row + nope + 2 * i[None, :], mask=m, other=0.0).to(tl.float32)
    od = tl.load(x_row + nope + 2 * i[None, :] + 1, mask=m, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(o_row + nope + 2 * i[None, :], (ev * c - od * s).to(ty), mask=m)
    tl.store(o_row + nope + 2 * i[None, :] + 1, (ev * s + od * c).to(ty), mask=m)


def rope(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False
) -> torch.Tensor:
    """Interleaved RoPE on the trailing ``2 * len(inv_freq)`` channels of ``x [T, H, D]`` (or ``[T, D]``)."""
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(1) if squeeze else x
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    T, H, D = x3.shape
    R2 = inv_freq.numel()
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    if T == 0:
        return out.view(x.shape)
    cfg = dispatch.rope_config(H, D - 2 * R2, R2)
    _rope_kernel[(T, triton.cdiv(H, cfg.block_h))](
        x3, positions.contiguous(), inv_freq.float().contiguous(), out,
        H, D, R2, x3.stride(0), x3.stride(1), out.stride(0), out.stride(1),
        SIGN=-1.0 if inverse else 1.0, BLOCK_H=cfg.block_h, BLOCK_NOPE=cfg.block_nope, BLOCK_R2=cfg.block_r2,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    return out.view(x.shape)
