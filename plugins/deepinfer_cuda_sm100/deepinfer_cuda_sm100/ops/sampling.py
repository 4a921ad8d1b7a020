"""CUDA sampling ops.

Triton: ``apply_penalties`` and ``apply_bitmask`` (one read and one write of ``[B, V]`` each), and
``probs`` (every cut a threshold found by bisection, no sort). Torch on the GPU: ``sample`` and
``rejection_sample`` (exponential-race draws with per-row generators), ``argmax``.
"""

from __future__ import annotations

import torch

from deepinfer_core.ops.sampling import SamplingOps, SamplingTensors
from deepinfer_cuda_sm100.kernels import sampling as ks


def _exponential(
    shape: tuple[int, ...], gens: list[torch.Generator | None], device: torch.device
) -> torch.Tensor:
    """``Exp(1)`` noise with row ``b`` drawn from ``gens[b]``; rows without a generator share one draw."""
    q = torch.empty(shape, dtype=torch.float32, device=device)
    unseeded = [b for b, g in enumerate(gens) if g is None]
    if unseeded:
        idx = torch.tensor(unseeded, device=device)
        q[idx] = torch.empty((len(unseeded), *shape[1:]), device=device).exponential_()
    for b, g in enumerate(gens):
        if g is not None:
            q[b].exponential_(generator=g)
    return q


def _race(probs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``argmax(p / q)`` with ``q ~ Exp(1)`` draws index ``i`` with probability ``p_i / sum(p)``."""
    return (probs / q).argmax(dim=-1)


class CudaSamplingOps(SamplingOps):
    def apply_penalties(self, logits, prompt_mask, output_counts, presence, frequency, repetition):
        return ks.apply_penalties(logits, prompt_mask, output_counts, presence, frequency, repetition)

    def apply_bitmask(self, logits, bitmask):
        return ks.apply_bitmask(logits, bitmask)

    def argmax(self, logits):
        return logits.argmax(dim=-1)

    def probs(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        """Temperature, top-k (ties at the k-th value kept), softmax, top-p (stable order: equal
        probabilities by token id), min-p, renormalised; one Triton program per row, no sort
        (``kernels/sampling.py``), no host synchronisation."""
        return ks.probs(logits, params.temperature, params.top_k, params.top_p, params.min_p)

    def sample(self, probs, generators):
        return _race(probs, _exponential(tuple(probs.shape), generators, probs.device))

    def rejection_sample(self, draft_ids, draft_probs, target_probs, generators):
        B, k = draft_ids.shape
        dev = target_probs.device
        p = target_probs[:, :k].gather(2, draft_ids[..., None]).squeeze(2)
        q = (
            torch.ones_like(p)
            if draft_probs is None
            else draft_probs.gather(2, draft_ids[..., None]).squeeze(2)
        )
        u = torch.empty((B, k), device=dev)
        for b, g in enumerate(generators):
            u[b].uniform_(generator=g) if g is not None else u[b].uniform_()
        accept = u * q < p
        n_acc = accept.long().cumprod(dim=1).sum(dim=1)
        pos = n_acc.clamp(max=k)
        tgt = target_probs.gather(1, pos[:, None, None].expand(B, 1, target_probs.shape[2])).squeeze(1)
        if draft_probs is None:
            drf = torch.zeros_like(tgt).scatter_(1, draft_ids.gather(1, pos.clamp(max=k - 1)[:, None]), 1.0)
        else:
            drf = draft_probs.gather(
                1, pos.clamp(max=k - 1)[:, None, None].expand(B, 1, tgt.shape[1])
            ).squeeze(1)
        resid = torch.where((n_acc < k)[:, None], (tgt - drf).clamp(min=0), tgt)
        resid = torch.where(resid.sum(1, keepdim=True) > 0, resid, tgt)
        final = _race(resid, _exponential(tuple(resid.shape), generators, dev))
        tokens = torch.full((B, k + 1), -1, dtype=torch.int64, device=dev)
        col = torch.arange(k + 1, device=dev)[None, :]
        tokens = torch.where(col < n_acc[:, None], torch.cat([draft_ids, draft_ids[:, :1]], 1), tokens)
        tokens.scatter_(1, n_acc[:, None], final[:, None])
        return tokens, n_acc
