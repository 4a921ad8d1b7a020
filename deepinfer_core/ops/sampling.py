"""Sampling ops: batched logits processing, sampling, and the rejection-sampling primitive.

The engine's sampler (``deepinfer_core.engine.sampler``) builds :class:`SamplingTensors` once per step
and calls these ops; per-request randomness comes from one ``torch.Generator`` per seeded request so a
request's tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


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

    @abstractmethod
    def sample(self, probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
        """Draw one token per row from ``probs [B, V]`` -> ``[B]`` int64, using row ``b``'s generator
        (``None``: the default generator). Rows must consume randomness independently of each other,
        and a row's draw must depend only on its probabilities and its generator's state. Tokens with
        probability 0 are never drawn."""

    @abstractmethod
    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy token per row; ties go to the lowest token id. -> ``[B]`` int64."""

    @abstractmethod
    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        """Structured-output mask: ``bitmask [B, ceil(V/32)]`` int32, bit ``v % 32`` of word ``v // 32``
        set = token ``v`` allowed. Disallowed logits become ``-inf``. Returns the masked logits."""

    @abstractmethod
    def rejection_sample(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        generators: list[torch.Generator | None],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Speculative verification for ``B`` rows of ``k`` drafts.

        ``draft_ids [B, k]``, ``draft_probs [B, k, V]`` (``None``: one-hot drafts, e.g. n-gram),
        ``target_probs [B, k+1, V]``. Accept draft ``j`` with probability ``min(1, p/q)``; at the first
        rejection sample from ``normalize(max(0, p - q))``; if all are accepted, sample a bonus token
        from ``target_probs[:, k]``. Returns ``(tokens [B, k+1] int64 padded with -1, num_accepted [B])``
        where row ``b`` emits ``num_accepted[b] + 1`` tokens.

        Randomness: row ``b`` draws only from ``generators[b]``: one uniform per examined draft, then the
        one token it samples (residual or bonus). If the residual has no mass (``p == q``, which cannot be
        rejected in exact arithmetic), the token is drawn from ``target_probs[b, j]``.
        """
