"""The parameters of one mHC site, carried as one frozen object by every mHC op."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class HCParams:
    """One mHC site's parameters (a V4 block's ``hc_attn_*`` / ``hc_ffn_*``, or the ``hc_head_*`` collapse).

    For ``N`` streams of ``D`` channels: ``fn [(2+N)*N, N*D]``, ``base [(2+N)*N]`` and ``scale [3]`` (all
    float32) give the ``pre``, ``post`` and ``comb`` mixes of a sublayer's entry; the head's collapse has
    ``fn [N, N*D]``, ``base [N]``, ``scale [1]`` and no Sinkhorn (its ``sinkhorn_iters`` is not read).
    ``hc_eps`` is the mixes' epsilon, ``norm_eps`` the RMSNorm epsilon of the mixes' input and, for the fused
    entry ops, of the sublayer's norm. Built once, when the weights are loaded."""

    fn: torch.Tensor
    base: torch.Tensor
    scale: torch.Tensor
    sinkhorn_iters: int
    hc_eps: float
    norm_eps: float


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn-Knopp on ``[..., N, N]``: one column normalisation, then ``iters - 1`` (row, column) rounds,
    every denominator ``+ eps``. Elementwise steps and sums over ``N`` only, so a matrix gets the same bits
    whatever else is in the batch (``tests/ops/test_reference_batch_invariance.py``): the row-by-row defaults
    run it once over all rows (row by row it was a quarter of the reference backend's time on V4.1)."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def mixes(x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V4.1's single-pass mHC coefficients of streams ``x [R, N, D]`` before ``comb``'s Sinkhorn, all
    float32.

    ``mixes = (flat(x) @ fn.T) * rsqrt(mean(flat(x)^2) + norm_eps)`` over the ``N * D`` flattened channels
    (the projection first, then the per-token statistic), then ``pre = sigmoid(m * s0 + b) + hc_eps``,
    ``post = 2 * sigmoid(m * s1 + b)`` and ``comb = softmax_last(m * s2 + b) + hc_eps`` ->
    ``(pre [R, N], post [R, N], comb [R, N, N])``; :func:`mix_coefficients` adds the Sinkhorn."""
    n = x.shape[1]
    flat = x.flatten(1).float()
    rsqrt = torch.rsqrt(flat.square().mean(-1, keepdim=True) + hc.norm_eps)
    mixes = torch.nn.functional.linear(flat, hc.fn.float()) * rsqrt
    scale, base = hc.scale.float(), hc.base.float()
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + hc.hc_eps
    post = 2 * torch.sigmoid(mixes[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    comb = (mixes[:, 2 * n :] * scale[2] + base[2 * n :]).unflatten(-1, (n, n))
    return pre, post, comb.softmax(-1) + hc.hc_eps


def mix_coefficients(x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V4.1's single-pass mHC coefficients of streams ``x [R, N, D]``, all float32: :func:`mixes`,
    then ``comb``'s Sinkhorn -> ``(pre [R, N], post [R, N], comb [R, N, N])``."""
    pre, post, comb = mixes(x, hc)
    return pre, post, sinkhorn(comb, hc.sinkhorn_iters, hc.hc_eps)


def collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``sum_n pre[:, n] * x[:, n]`` over streams ``x [R, N, D]`` in float32, cast to ``x.dtype`` -> ``[R, D]``."""
    return (pre.float().unsqueeze(-1) * x.float()).sum(dim=1).to(x.dtype)
