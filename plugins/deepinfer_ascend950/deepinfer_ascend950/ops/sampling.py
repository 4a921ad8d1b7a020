"""Sampling ops on the NPU: ``npu_top_k_top_p`` for the top-k/top-p filter of :meth:`probs`; the rest
is the core's vectorised torch code, which runs unchanged on the NPU (``sample_keyed`` and
``rejection_sample_keyed``: the base class's keyed draws, the whole batch at once)."""

from __future__ import annotations

import torch

from deepinfer_ascend950._npu import torch_npu
from deepinfer_core.plugin_api import SamplingOps, SamplingTensors, reference_op

TOPK_MAX = 1024  # npu_top_k_top_p: k in [1, 1024]


class AscendSamplingOps(SamplingOps):
    def __init__(self, fused: dict[str, bool]):
        self.fused = fused
        self._torch = reference_op("sampling")

    def apply_penalties(self, logits, prompt_mask, output_counts, presence, frequency, repetition):
        return self._torch.apply_penalties(
            logits, prompt_mask, output_counts, presence, frequency, repetition
        )

    def probs(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        """Temperature in torch, then ``npu_top_k_top_p(logits, p, k)`` (stable ascending sort; keeps
        values >= the k-th largest; drops the tokens whose ascending cumulative probability is <= 1 - p,
        always keeping the largest), softmax, then min-p and greedy rows in torch.

        The fused filter needs every row's k in [1, 1024]: a row without top-k is given ``k = V`` when
        ``V <= 1024``; otherwise (or with the switch off) the whole call takes the torch path."""
        v = logits.shape[-1]
        k = torch.where(params.top_k > 0, params.top_k.clamp(max=v), torch.full_like(params.top_k, v))
        if not (self.fused["probs"] and logits.dim() == 2 and v > 0 and bool((k <= TOPK_MAX).all())):
            return self._torch.probs(logits, params)
        lf = logits.float()
        greedy = params.temperature <= 0
        t = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
        top_p = params.top_p.float().clamp(0.0, 1.0)
        x = torch_npu().npu_top_k_top_p(lf / t[:, None], top_p, k.to(torch.int32))
        p = torch.softmax(x, dim=-1)
        if bool((params.min_p > 0).any()):
            keep = p >= params.min_p[:, None] * p.amax(dim=-1, keepdim=True)
            p = torch.where(keep, p, torch.zeros_like(p))
            p = p / p.sum(dim=-1, keepdim=True)
        if bool(greedy.any()):
            onehot = torch.zeros_like(p).scatter_(1, self.argmax(lf)[:, None], 1.0)
            p = torch.where(greedy[:, None], onehot, p)
        return p

    def argmax(self, logits):
        return self._torch.argmax(logits)

    def apply_bitmask(self, logits, bitmask):
        return self._torch.apply_bitmask(logits, bitmask)
