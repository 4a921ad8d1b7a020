"""CUDA sampling ops.

Triton: ``apply_penalties`` and ``apply_bitmask`` (one read and one write of ``[B, V]`` each).
Triton: ``sample_keyed`` (the core's keyed draw in two launches for the whole batch) and ``probs``
(``kernels/probs.py``: top-k and top-p by radix searches over chunks of every row, no sort; ``radix_probs``).
Torch on the GPU: ``probs`` with ``radix_probs`` off (a sort per cut), ``rejection_sample_keyed`` (the core's vectorised
verification, its final draw the Triton draw), ``argmax``. Either ``probs`` is replayed from a graph per bucket
of up to 16 rows with ``graphed_probs``. An earlier Triton ``probs`` of one program per row (every cut a
bisection threshold) was correct but 1.3x slower than the sorts on the H200 (benchmarks/gpu/NOTES.md v7).
"""

from __future__ import annotations

import functools

import torch

from deepinfer_core.plugin_api import SamplingOps, SamplingTensors, keyed_rejection
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import probs as kp
from deepinfer_cuda_sm100.kernels import sampling as ks
from deepinfer_cuda_sm100.ops.row_graphs import RowGraphs


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
        self._probs_graphs: dict[tuple[bool, tuple[bool, bool, bool]], RowGraphs] = {}

    def apply_penalties(self, logits, prompt_mask, output_counts, presence, frequency, repetition):
        return ks.apply_penalties(logits, prompt_mask, output_counts, presence, frequency, repetition)

    def apply_bitmask(self, logits, bitmask):
        return ks.apply_bitmask(logits, bitmask)

    def argmax(self, logits):
        return logits.argmax(dim=-1)

    def probs(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        """The sort-free Triton ``probs`` (``kernels/probs.py``) with the ``radix_probs`` setting, otherwise
        :func:`_probs`, the torch sorts; a cut no row uses is skipped either way. With ``graphed_probs``, either is
        replayed from a captured graph per bucket of up to 16 rows (``RowGraphs``)."""
        cuts = (params.any_top_k, params.any_top_p, params.any_min_p)
        args = (logits.float(), params.temperature, params.top_k, params.top_p, params.min_p)
        radix = dispatch.radix_probs()
        fn = (
            functools.partial(kp.probs, top_k_used=cuts[0], top_p_used=cuts[1])
            if radix
            else functools.partial(_probs, cuts=cuts)
        )
        if not dispatch.graphed_probs():
            return fn(*args)
        graphs = self._probs_graphs.get((radix, cuts))
        if graphs is None:
            graphs = self._probs_graphs[(radix, cuts)] = RowGraphs(fn, self._capture)
        return graphs(*args)

    def sample_keyed(self, probs, seeds, positions):
        return ks.draw(probs, seeds, positions)

    def rejection_sample_keyed(self, draft_ids, draft_probs, target_probs, seeds, positions):
        return keyed_rejection(draft_ids, draft_probs, target_probs, seeds, positions, draw=ks.draw)
