"""Sampling ops: batched logits processing, sampling, and the rejection-sampling primitive.

The engine's sampler (``deepinfer_core.engine.sampler``) builds :class:`SamplingTensors` once per step
and calls these ops. Randomness is keyed (:mod:`deepinfer_core.ops.draws`, plugin API 2.8): a row's noise is a
function of its sequence's seed and the position of the token it draws, so a request's tokens do not depend
on the rest of the batch, and a whole batch draws in one launch with no generator state on the host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from deepinfer_core.ops import draws


@dataclass
class SamplingTensors:
    """Per-row sampling parameters for ``B`` rows (float32 / int64 tensors on the logits' device)."""

    temperature: torch.Tensor  # [B]; 0 means greedy
    top_k: torch.Tensor  # [B] int64; -1 or 0 disables
    top_p: torch.Tensor  # [B]; 1 disables
    min_p: torch.Tensor  # [B]; 0 disables
    #: what the host knows of the rows (plugin API 2.5): ``False`` when no row uses the cut, so a platform may
    #: skip it (it is the identity for every row: a full sort of ``[B, V]`` for top-k or top-p). ``True`` (the
    #: default) promises nothing.
    any_top_k: bool = True
    any_top_p: bool = True
    any_min_p: bool = True
    #: the rows' keyed randomness (plugin API 2.8), ``[B]`` int64 or None where the caller draws nothing: each
    #: row's sampling seed and the position of the token it draws (``SamplingOps.sample_keyed``)
    seeds: torch.Tensor | None = None
    positions: torch.Tensor | None = None


def cuts_used(top_k: int, top_p: float, min_p: float) -> tuple[bool, bool, bool]:
    """Whether a row with these parameters uses top-k, top-p and min-p (the order of ``SamplingTensors.any_*``)."""
    return top_k > 0, top_p < 1, min_p > 0


class SamplingOps(ABC):
    @abstractmethod
    def apply_penalties(
        self,
        logits: torch.Tensor,
        prompt_mask: torch.Tensor,
        output_counts: torch.Tensor,
        presence: torch.Tensor,
        frequency: torch.Tensor,
        repetition: torch.Tensor,
    ) -> torch.Tensor:
        """vLLM-semantics penalties on ``logits [B, V]`` f32. ``prompt_mask [B, V]`` bool (token in
        prompt), ``output_counts [B, V]`` int (occurrences in the output so far). Repetition divides
        positive / multiplies negative logits of tokens seen in prompt or output; frequency subtracts
        ``frequency * count``; presence subtracts ``presence * (count > 0)``. Returns new logits."""

    @abstractmethod
    def probs(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        """The sampling distribution ``[B, V]`` f32, in this order: divide by temperature; top-k keeps
        the logits ``>=`` the k-th largest (ties at the threshold stay); softmax; top-p keeps the
        smallest set of most likely tokens whose mass reaches ``top_p`` (the most likely token always
        stays; equal probabilities are ordered by token id); min-p keeps tokens with
        ``p >= min_p * max(p)``; renormalise. Greedy rows (temperature 0) get a one-hot at the argmax.
        Each row depends only on its own logits and parameters (batch invariant)."""

    def sample_keyed(self, probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Draw one token per row from ``probs [B, V]`` -> ``[B]`` int64 (plugin API 2.8): row ``b`` by
        :func:`draws.draw <deepinfer_core.ops.draws.draw>` keyed at ``(seeds[b], positions[b], draws.SAMPLE)``
        (``[B]`` int64 on the device: the sample's seed and the position of the token drawn). A platform's draws
        must equal the core's on the same inputs (up to float64 rounding of the running sum). Tokens with
        probability 0 are never drawn. The default is the core's torch code; a platform overrides it with a
        kernel."""
        return draws.draw(probs, seeds, positions)

    @abstractmethod
    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy token per row; ties go to the lowest token id. -> ``[B]`` int64."""

    @abstractmethod
    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        """Structured-output mask: ``bitmask [B, ceil(V/32)]`` int32, bit ``v % 32`` of word ``v // 32``
        set = token ``v`` allowed. Disallowed logits become ``-inf``. Returns the masked logits."""

    def rejection_sample_keyed(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        seeds: torch.Tensor,
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Speculative verification for ``B`` rows of ``k`` drafts (plugin API 2.8).

        ``draft_ids [B, k]``, ``draft_probs [B, k, V]`` (``None``: one-hot drafts, e.g. n-gram),
        ``target_probs [B, k+1, V]``. Accept draft ``j`` with probability ``min(1, p/q)``; at the first
        rejection sample from ``normalize(max(0, p - q))``; if all are accepted, sample a bonus token
        from ``target_probs[:, k]``. Returns ``(tokens [B, k+1] int64 padded with -1, num_accepted [B])``
        where row ``b`` emits ``num_accepted[b] + 1`` tokens.

        Randomness (keyed, :mod:`~deepinfer_core.ops.draws`): ``positions[b]`` is the position of the token draft
        0 proposes. Draft ``j`` is accepted iff ``u * q(d) < p(d)`` in float64, ``u`` the uniform at
        ``(seeds[b], positions[b] + j, draws.ACCEPT)``; the token drawn at position ``positions[b] + a`` (the
        residual or the bonus) is the draw at ``(seeds[b], positions[b] + a, draws.SAMPLE)``. If the residual
        has no mass (``p == q``, which cannot be rejected in exact arithmetic), the token is drawn from
        ``target_probs[b, a]``. The default is the core's vectorised torch composition (no host sync).
        """
        return keyed_rejection(draft_ids, draft_probs, target_probs, seeds, positions)


def keyed_rejection(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    draw=draws.draw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`SamplingOps.rejection_sample_keyed` for every row at once, in torch; ``draw(probs, seeds,
    positions)``: the platform's keyed draw (default :func:`draws.draw`)."""
    B, k = draft_ids.shape
    dev = target_probs.device
    pos = positions.to(torch.int64)
    p = target_probs[:, :k].gather(2, draft_ids[..., None]).squeeze(2).float()
    q = (
        torch.ones_like(p)
        if draft_probs is None
        else draft_probs.gather(2, draft_ids[..., None]).squeeze(2).float()
    )
    col = torch.arange(k + 1, device=dev)
    at = (pos[:, None] + col[None, :k]).reshape(-1)
    u = draws.uniforms(seeds.to(torch.int64).repeat_interleave(k), at, draws.ACCEPT).view(B, k)
    accept = u * q < p
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)
    tgt = target_probs.gather(1, n_acc[:, None, None].expand(B, 1, target_probs.shape[2])).squeeze(1).float()
    last = n_acc.clamp(max=k - 1)[:, None]
    if draft_probs is None:
        drf = torch.zeros_like(tgt).scatter_(1, draft_ids.gather(1, last), 1.0)
    else:
        drf = draft_probs.gather(1, last[:, :, None].expand(B, 1, tgt.shape[1])).squeeze(1).float()
    resid = torch.where((n_acc < k)[:, None], (tgt - drf).clamp(min=0), tgt)
    resid = torch.where(resid.sum(1, keepdim=True) > 0, resid, tgt)
    final = draw(resid, seeds, pos + n_acc)
    tokens = torch.where(col[None, :] < n_acc[:, None], torch.cat([draft_ids, draft_ids[:, :1]], 1), -1)
    tokens = tokens.scatter(1, n_acc[:, None], final[:, None])
    return tokens, n_acc
