"""DeepSeek-V4.1's Engram gate in one launch (:meth:`deepinfer_core.ops.dense.DenseOps.engram_gate`).

Program ``(t, stream)`` reads its stream's row ``h``, its key and the stream's gate weight twice, in
``BLOCK_D`` chunks: the first pass sums ``h * h``, ``key * key`` and ``h * weight * key`` in float32, which give
``dot = sum(h * weight * key) * rsqrt(mean(h^2) + eps) * rsqrt(mean(key^2) + eps) / sqrt(D)`` and
``gate = sigmoid(sign(dot) * sqrt(max(|dot|, floor)))``; the second writes ``h + gate * value`` (the value row is
shared by the streams). The torch composition (``engram_gate_rows``) is ~10 launches; the sums here run in
another order, so the result equals it to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_core.plugin_api import ENGRAM_GATE_FLOOR
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pow2, round_nearest_even


@triton.jit
def _engram_gate_kernel(
    h_ptr, k_ptr, v_ptr, w_ptr, out_ptr, D,
    stride_ht, stride_hn, stride_kt, stride_kn, stride_vt, stride_ot, stride_on,
    eps, floor, inv_sqrt_d,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    h_row = h_ptr + t * stride_ht + s * stride_hn
    k_row = k_ptr + t * stride_kt + s * stride_kn
    w_row = w_ptr + s * D
    sq_h = tl.zeros([BLOCK_D], dtype=tl.float32)
    sq_k = tl.zeros([BLOCK_D], dtype=tl.float32)
    hwk = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        m = d < D
        h = tl.load(h_row + d, mask=m, other=0.0).to(tl.float32)
        k = tl.load(k_row + d, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_row + d, mask=m, other=0.0).to(tl.float32)
        sq_h += h * h
        sq_k += k * k
        hwk += h * w * k
    rstd = tl.rsqrt(tl.sum(sq_h, 0) / D + eps) * tl.rsqrt(tl.sum(sq_k, 0) / D + eps)
    dot = tl.sum(hwk, 0) * rstd * inv_sqrt_d
    mag = tl.sqrt(tl.maximum(tl.abs(dot), floor))
    negative = (dot.to(tl.uint32, bitcast=True) >> 31) != 0  # copysign: -0.0 counts as negative
    gate = tl.sigmoid(tl.where(negative, -mag, mag))
    o_row = out_ptr + t * stride_ot + s * stride_on
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        m = d < D
        h = tl.load(h_row + d, mask=m, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * stride_vt + d, mask=m, other=0.0).to(tl.float32)
        tl.store(o_row + d, round_nearest_even(h + gate * v, out_ptr.dtype.element_ty), mask=m)


def engram_gate(h: torch.Tensor, key: torch.Tensor, value: torch.Tensor, weight: torch.Tensor, eps: float):
    """``h [T, N, D]``, ``key [T, N, D]``, ``value [T, D]``, ``weight [N, D]`` -> ``[T, N, D]`` in ``h.dtype``."""
    T, N, D = h.shape
    out = torch.empty_like(h, memory_format=torch.contiguous_format)
    if T == 0:
        return out
    h, key, value = (x if x.stride(-1) == 1 else x.contiguous() for x in (h, key, value))
    weight = weight.contiguous()  # widened as the kernel loads it
    _engram_gate_kernel[(T, N)](
        h, key, value, weight, out, D,
        h.stride(0), h.stride(1), key.stride(0), key.stride(1), value.stride(0), out.stride(0), out.stride(1),
        eps, ENGRAM_GATE_FLOOR, D**-0.5,
        BLOCK_D=min(pow2(D, 16), 2048), num_warps=4, **dispatch.pdl_args(T),
    )  # fmt: skip
    return out


@triton.jit
def _engram_hash_kernel(
    ids_ptr, slots_ptr, mult_ptr, primes_ptr, offsets_ptr, out_ptr, pad_id, L, J, stride_ids,
    N: tl.constexpr, HEADS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_J: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Program ``t``: token ``t``'s Engram rows ``out[t] [L, J]`` (``J = (N - 1) * HEADS``). Its ``N`` history ids
    are read from the look-back pool at ``slots[t]`` (``-1``: none); a dead id (``-1``) blocks it and every older
    one (the pad id); column ``j`` of layer ``l`` is the rolling xor of ``id_k * mult[l, k]`` over ``k <= j //
    HEADS + 1``, modulo ``primes[l, j]``, plus ``offsets[l, j]`` (all int64, as ``engram_hash_rows``)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    lane_l = tl.arange(0, BLOCK_L)[:, None]
    lane_j = tl.arange(0, BLOCK_J)[None, :]
    m = (lane_l < L) & (lane_j < J)
    upto = lane_j // HEADS + 1
    acc = tl.zeros([BLOCK_L, BLOCK_J], dtype=tl.int64)
    blocked = tl.zeros([1, 1], dtype=tl.int1)
    for k in tl.static_range(N):
        slot = tl.load(slots_ptr + t * N + k).to(tl.int64)
        v = tl.load(ids_ptr + tl.maximum(slot, 0) * stride_ids).to(tl.int64)
        v = tl.where(slot >= 0, v, -1)
        blocked = blocked | (v < 0)
        tok = tl.where(blocked, pad_id, v).to(tl.int64)
        mult = tl.load(mult_ptr + lane_l * N + k, mask=lane_l < L, other=0)
        acc = tl.where(k <= upto, acc ^ (tok * mult), acc)
    p = tl.load(primes_ptr + lane_l * J + lane_j, mask=m, other=1)
    r = acc % p
    r = tl.where(r < 0, r + p, r)  # torch's remainder takes the divisor's sign
    r += tl.load(offsets_ptr + lane_l * J + lane_j, mask=m, other=0)
    tl.store(out_ptr + t * L * J + lane_l * J + lane_j, r, mask=m)


def engram_hashes(ids: torch.Tensor, slots: torch.Tensor, pad_id: int, multipliers: torch.Tensor,
                  primes: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``DenseOps.engram_hashes`` in one launch: ``ids [S, 1]`` int64, ``slots [T, N]``, ``multipliers [L, N]``,
    ``primes [L, N - 1, heads]``, ``offsets [L, (N - 1) * heads]`` (int64) -> ``[T, L, (N - 1) * heads]``."""
    T, N = slots.shape
    L, _, heads = primes.shape
    J = (N - 1) * heads
    out = torch.empty((T, L, J), dtype=torch.int64, device=slots.device)
    if T == 0:
        return out
    _engram_hash_kernel[(T,)](
        ids, slots.contiguous(), multipliers.contiguous(), primes.contiguous(), offsets.contiguous(), out, pad_id,
        L, J, ids.stride(0), N=N, HEADS=heads, BLOCK_L=pow2(L), BLOCK_J=pow2(J), num_warps=1,
        **dispatch.pdl_args(T),
    )  # fmt: skip
    return out
