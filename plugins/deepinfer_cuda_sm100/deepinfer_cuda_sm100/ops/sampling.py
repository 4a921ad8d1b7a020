"""CUDA sampling ops.

Triton: ``apply_penalties`` and ``apply_bitmask`` (one read and one write of ``[B, V]`` each).
Torch on the GPU: ``probs`` (two sorts per row; with ``graphed_probs``, replayed from a graph per bucket of up to 16 rows), ``sample`` and ``rejection_sample`` (exponential-race
draws with per-row generators), ``argmax``. A one-program-per-row Triton ``probs`` (every cut a bisection
threshold, no sort) was correct but 1.3x slower than the sorts on the H200 (benchmarks/gpu/NOTES.md v7).
"""

from __future__ import annotations

import functools

import torch

from deepinfer_core.plugin_api import SamplingOps, SamplingTensors
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import sampling as ks
from deepinfer_cuda_sm100.ops.row_graphs import RowGraphs


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


def _probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    cuts: tuple[bool, bool, bool] = (True, True, True),
) -> torch.Tensor:
    """Temperature, top-k (ties at the k-th value kept), softmax, top-p (stable order: equal probabilities by
    token id), min-p, renormalising after each cut; the same order and tie rules as the reference, with no host
    synchronisation (disabled cuts are identities per row). Row-wise: row ``b`` reads only row ``b``. ``cuts``:
    whether any row uses top-k, top-p, min-p (``SamplingTensors.any_*``); a cut no row uses is skipped, its
    renormalisation kept, so the result is the same bits (top-k and top-p each cost a full sort of ``[B, V]``)."""
    V = logits.shape[-1]
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    x = logits / temp[:, None]
    if cuts[0]:
        kk = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))
        thresh = torch.sort(x, dim=-1, descending=True).values.gather(1, (kk - 1)[:, None])
        x = x.masked_fill(x < thresh, float("-inf"))
    p = torch.softmax(x, dim=-1)
    if cuts[1]:
        order = torch.sort(-p, dim=-1, stable=True).indices
        sp = p.gather(1, order)
        keep_sorted = (torch.cumsum(sp, dim=-1) - sp < top_p[:, None]) | (top_p[:, None] >= 1)
        keep_sorted[:, 0] = True
        p = p * torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    p = p / p.sum(dim=-1, keepdim=True)
    if cuts[2]:
        p = torch.where(p >= min_p[:, None] * p.amax(dim=-1, keepdim=True), p, torch.zeros_like(p))
    p = p / p.sum(dim=-1, keepdim=True)
    onehot = torch.zeros_like(p).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], onehot, p)


class CudaSamplingOps(SamplingOps):
    def __init__(self, capture=None) -> None:
        """``capture``: how ``probs`` graphs are captured (``RowGraphs``; default CUDA's, a stand-in in tests)."""
        self._capture = capture
        self._probs_graphs: dict[tuple[bool, bool, bool], RowGraphs] = {}

    def apply_penalties(self, logits, prompt_mask, output_counts, presence, frequency, repetition):
        return ks.apply_penalties(logits, prompt_mask, output_counts, presence, frequency, repetition)

    def apply_bitmask(self, logits, bitmask):
        return ks.apply_bitmask(logits, bitmask)

    def argmax(self, logits):
        return logits.argmax(dim=-1)

    def probs(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        """:func:`_probs`; with the ``graphed_probs`` setting (off by default until run on a GPU) replayed from a
        captured graph per bucket of up to 16 rows (``RowGraphs``: ~30 launches become three)."""
        cuts = (params.any_top_k, params.any_top_p, params.any_min_p)
        args = (logits.float(), params.temperature, params.top_k, params.top_p, params.min_p)
        if not dispatch.graphed_probs():
            return _probs(*args, cuts=cuts)
        graphs = self._probs_graphs.get(cuts)
        if graphs is None:
            graphs = self._probs_graphs[cuts] = RowGraphs(functools.partial(_probs, cuts=cuts), self._capture)
        return graphs(*args)

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
