"""RMSNorm over rows and interleaved partial RoPE over ``[T, H, D]`` (both memory-bound, one pass), and the
two fused (V4's query heads and KV row: one launch instead of two)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pool_slot


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, D, stride_x, stride_o, eps, HAS_W: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
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
            y = y * tl.load(w_ptr + d0 + cols, mask=m, other=0.0).to(tl.float32)
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
    w = weight.contiguous() if weight is not None else x2  # any float dtype: widened as the kernel loads it
    _rms_norm_kernel[(x2.shape[0],)](
        x2, w, out, D, x2.stride(0), out.stride(0), eps,
        HAS_W=weight is not None, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps, **dispatch.pdl_args(x2.shape[0]),
    )  # fmt: skip
    return out.view(x.shape)


@triton.jit
def _rope_kernel(
    x_ptr, pos_ptr, freq_ptr, out_ptr,
    H, D, R2, stride_xt, stride_xh, stride_ot, stride_oh,
    SIGN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_NOPE: tl.constexpr, BLOCK_R2: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
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
        num_warps=cfg.num_warps, **dispatch.pdl_args(T),
    )  # fmt: skip
    return out.view(x.shape)


@triton.jit
def rope_row(x, pos, freq_ptr, D, R2, BLOCK_D: tl.constexpr, SIGN: tl.constexpr = 1.0):
    """Interleaved RoPE of the trailing ``2 * R2`` channels of a float32 row ``x [BLOCK_D]`` (``D`` used) at
    position ``pos``: pair ``(2i, 2i+1)`` of the row; leading channels unchanged (as stored: signed zeros
    too). ``SIGN = -1``: the inverse rotation (``rope(..., inverse=True)``)."""
    ev, od = tl.split(tl.reshape(x, (BLOCK_D // 2, 2)))
    f = tl.arange(0, BLOCK_D // 2) - (D // 2 - R2)
    rot = (f >= 0) & (f < R2)
    ang = pos * tl.load(freq_ptr + f, mask=rot, other=0.0)
    c = tl.cos(ang)
    s = SIGN * tl.sin(ang)
    return tl.reshape(
        tl.join(tl.where(rot, ev * c - od * s, ev), tl.where(rot, ev * s + od * c, od)), (BLOCK_D,)
    )


@triton.jit
def rope_tile(x, pos, freq_ptr, D, R2, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """:func:`rope_row` over each row of a float32 tile ``x [BLOCK_H, BLOCK_D]`` (the heads of one token), all
    at position ``pos``."""
    ev, od = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_D // 2, 2)))
    f = tl.arange(0, BLOCK_D // 2) - (D // 2 - R2)
    rot = (f >= 0) & (f < R2)
    ang = pos * tl.load(freq_ptr + f, mask=rot, other=0.0)
    c = tl.cos(ang)[None, :]
    s = tl.sin(ang)[None, :]
    r = rot[None, :]
    return tl.reshape(
        tl.join(tl.where(r, ev * c - od * s, ev), tl.where(r, ev * s + od * c, od)), (BLOCK_H, BLOCK_D)
    )


@triton.jit
def _rms_norm_rope_kernel(x_ptr, w_ptr, pos_ptr, freq_ptr, out_ptr, H, D, R2, stride_xt, stride_xh, stride_ot,
                          stride_oh, eps, slots_ptr, S, HAS_W: tl.constexpr, BLOCK_D: tl.constexpr,
                          SCATTER: tl.constexpr = False, PDL: tl.constexpr = False):  # fmt: skip
    """Program ``t * H + h``: the row ``x[t, h]`` normed (rounded to ``x``'s dtype, as the separate ops round)
    and rotated at ``pos[t]``. ``SCATTER`` (``H == 1``): stored at row ``slots[t]`` of a plain pool ``out``
    of ``S`` rows (``-1``: its last, scratch row), in the pool's dtype as ``store_kv`` casts it
    (``compose_rms_norm_rope_store_kv``)."""
    pdl_enter(PDL)
    row = tl.program_id(0)
    t = (row // H).to(tl.int64)
    h = row % H
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + d, mask=dm, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps))
    if HAS_W:
        y = y * tl.load(w_ptr + d, mask=dm, other=0.0).to(tl.float32)
    ty = x_ptr.dtype.element_ty
    y = y.to(ty).to(tl.float32)
    y = rope_row(y, tl.load(pos_ptr + t).to(tl.float32), freq_ptr, D, R2, BLOCK_D).to(ty)
    o = t
    if SCATTER:
        o = pool_slot(slots_ptr, t, S)
    tl.store(out_ptr + o * stride_ot + h * stride_oh + d, y.to(out_ptr.dtype.element_ty), mask=dm)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor | None, eps: float, positions: torch.Tensor,
                  inv_freq: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The fused ``compose_rms_norm_rope`` (plugin API): ``x [T, H, D]``, one program per row."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    T, H, D = x.shape
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    if T * H == 0:
        return out
    cfg = dispatch.rows_config(D)
    w = weight.contiguous() if weight is not None else x  # widened as the kernel loads it
    _rms_norm_rope_kernel[(T * H,)](
        x, w, positions.contiguous(), inv_freq.float().contiguous(), out, H, D, inv_freq.numel(),
        x.stride(0), x.stride(1), out.stride(0), out.stride(1), eps, positions, 0,
        HAS_W=weight is not None, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps, **dispatch.pdl_args(T),
    )  # fmt: skip
    return out


def rms_norm_rope_store(pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                        eps: float, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:  # fmt: skip
    """``pool[slots] = rms_norm_rope(x[:, None], ...)[:, 0].to(pool.dtype)`` for a plain pool ``[S, D]`` (rows
    contiguous) and ``x [T, D]``, one launch (``compose_rms_norm_rope_store_kv``; padding rows' slot ``-1`` is
    the scratch row)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    T, D = x.shape
    if T == 0:
        return
    cfg = dispatch.rows_config(D)
    w = weight.contiguous() if weight is not None else x
    _rms_norm_rope_kernel[(T,)](
        x, w, positions.contiguous(), inv_freq.float().contiguous(), pool, 1, D, inv_freq.numel(),
        x.stride(0), 0, pool.stride(0), 0, eps, slots.contiguous(), pool.shape[0],
        HAS_W=weight is not None, BLOCK_D=cfg.block_d, SCATTER=True, num_warps=cfg.num_warps,
        **dispatch.pdl_args(T),
    )  # fmt: skip
