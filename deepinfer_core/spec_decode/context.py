"""What a proposer gets from the engine (proposer contract 2.0): a small typed context, never the engine.

Life of a draft round:

1. after a target step, :meth:`Proposer.observe` gets one :class:`VerifiedRows` per sequence still
   running: which positions the step verified and where their rows are in the step's hidden states,
   which :meth:`ProposerContext.last_hidden` taps (inside a captured graph too: it is a graph output);
2. :meth:`Proposer.propose` drafts tokens for the decoding sequences. A proposer that writes state past
   the computed length reserves it with :meth:`ProposerContext.reserve` (the verify step needs those
   blocks anyway), builds its steps' batches with :meth:`ProposerContext.draft_batch` and runs them with
   :meth:`ProposerContext.run`, which replays a captured graph per shape bucket like a decode step.
   For each sequence it returns its draft tokens, either as a plain list (deterministic drafts: the
   verifier treats them as one-hot, ``q = 1`` on each draft) or as a :class:`Draft` carrying the
   distribution ``q`` each token was drawn from (contract 2.1), which the verifier uses for lossless
   rejection sampling. :meth:`ProposerContext.draft_probs` and :meth:`ProposerContext.draw` give a
   proposer the request's sampling transform and a generator of its own for that.

The context hands out no runner, scheduler or KV-manager object, so the engine can change them (and
capture graphs around them) without breaking a proposer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from deepinfer_core.models.base import CausalLM
    from deepinfer_core.models.batch import ForwardBatch
    from deepinfer_core.sampling_params import SamplingParams


class DraftSequence(Protocol):
    """What a proposer sees of a sequence."""

    seq_id: int  # unique for the engine's lifetime
    token_ids: list[int]  # verified tokens: prompt, then output (never drafts)
    num_computed: int  # tokens whose target state is in the KV pools
    params: SamplingParams  # the request's sampling parameters (read only; 2.1)


@dataclass(frozen=True)
class Draft:
    """One sequence's drafts with the distribution they were drawn from (contract 2.1).

    ``probs [len(token_ids), V]`` float32 on the engine's device: row ``j`` is ``q_j``, the distribution
    draft ``j`` was *sampled* from given the drafts before it, over the target's whole vocabulary (``V``
    = the width of the target's logits). The verifier accepts draft ``x`` with probability
    ``min(1, p_j(x) / q_j(x))``, on rejection draws from ``normalize(max(0, p_j - q_j))``, and after the
    last accepted draft draws the bonus token from ``p``, where ``p_j`` is the target's distribution
    exactly as plain sampling uses it. That is lossless only if each draft really was drawn from ``q_j``
    with randomness the verifier does not reuse (:meth:`ProposerContext.draw`), so ``q_j(x_j) > 0``.
    ``probs=None`` (or a plain list instead of a :class:`Draft`) means deterministic drafts, one-hot
    ``q``: the verifier's draws are then exactly those of plain sampling. A dense ``q`` costs
    ``k * V * 4`` bytes per sequence and round (2.6 MB for V4's vocabulary at k = 5), small next to the
    target's own ``(k + 1) * V`` logits, and the residual ``max(0, p - q)`` needs ``q`` on every token
    anyway, so no sparse form is offered.
    """

    token_ids: list[int]
    probs: torch.Tensor | None = None


@dataclass(frozen=True)
class VerifiedRows:
    """One sequence of the last target step: positions ``start .. start + num_verified - 1`` were computed and
    their input tokens accepted; their hidden states are rows ``row .. row + num_verified - 1`` of
    :meth:`ProposerContext.last_hidden`."""

    seq: DraftSequence
    start: int
    num_verified: int
    row: int


#: a draft step run by :meth:`ProposerContext.run`: ``fn(batch, *inputs) -> outputs`` with static shapes
DraftFn = Callable[..., tuple[torch.Tensor, ...]]


class ProposerContext(ABC):
    """The engine's services to a proposer."""

    #: the target model (a proposer calls its draft modules, e.g. ``mtp_forward``)
    model: CausalLM
    device: torch.device

    @abstractmethod
    def last_hidden(self) -> torch.Tensor | None:
        """Hidden states of the last target step's rows (layout of :meth:`CausalLM.forward`'s output), or
        None before the first step. Valid until the next step; index them with :attr:`VerifiedRows.row`."""

    @abstractmethod
    def reserve(self, seq: DraftSequence, num_tokens: int) -> bool:
        """Make room in every KV pool for ``num_tokens`` positions after ``seq``'s computed ones (draft
        positions). False (nothing reserved) when a pool is short; then draft less."""

    @abstractmethod
    def pools(self) -> Mapping[str, torch.Tensor]:
        """The KV pools by cache-spec name (a proposer's own specs, e.g. ``mtp.0.*``, are among them)."""

    @abstractmethod
    def draft_batch(
        self, seqs: Sequence[DraftSequence], starts: Sequence[int], ids: Sequence[Sequence[int]]
    ) -> ForwardBatch:
        """A batch on the device where sequence ``b`` computes positions ``starts[b] ..`` with input tokens
        ``ids[b]``, with the model's host-built plan. When every sequence has the same number of rows the
        batch has static shapes (rows padded to a bucket, padding rows at position -1), so :meth:`run` can
        replay a captured graph; ``batch.num_real_rows`` rows are real."""

    @abstractmethod
    def run(
        self, key: Any, fn: DraftFn, batch: ForwardBatch, *inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """``fn(batch, *inputs)``; captured as a graph per ``(key, batch bucket)`` on platforms that capture
        graphs, and replayed after copying ``batch`` and ``inputs`` into the captured buffers. ``inputs``
        must have ``batch``'s padded row count as their first dimension. Outputs are the graph's buffers,
        valid until the next call with the same key and bucket."""

    def draft_probs(self, seqs: Sequence[DraftSequence], logits: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[B, V]`` (row ``b``: sequence ``seqs[b]``) -> the distribution ``[B, V]`` float32
        each request's sampling would take from such logits: its temperature, top-k, top-p and min-p, as
        the engine's sampler applies them (greedy rows: one-hot at the argmax). Penalties, logit bias and
        the grammar are left out: ``q`` need not equal the target's ``p`` to be lossless, only be what
        the draft was drawn from. (2.1)"""
        raise NotImplementedError(f"{type(self).__name__} does not provide draft_probs")

    def draw(self, seqs: Sequence[DraftSequence], probs: torch.Tensor) -> list[int]:
        """One token per row of ``probs [B, V]``, row ``b`` with sequence ``seqs[b]``'s *draft* randomness:
        derived from the request's seed (so a seeded request drafts the same tokens every run) but separate
        from the randomness the verifier draws with, as lossless verification needs (keyed draws since
        2.8: the sequence's draft seed at a per-sequence draw counter). Never draws a token of probability
        0. (2.1)"""
        raise NotImplementedError(f"{type(self).__name__} does not provide draw")
