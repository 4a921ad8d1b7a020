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
