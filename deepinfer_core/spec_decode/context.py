"""What a proposer gets from the engine (proposer contract 2.0): a small typed context, never the engine.

Life of a draft round:

1. after a target step, :meth:`Proposer.observe` gets one :class:`VerifiedRows` per sequence still
   running: which positions the step verified and where their rows are in the step's hidden states,
   which :meth:`ProposerContext.last_hidden` taps (inside a captured graph too: it is a graph output);
2. :meth:`Proposer.propose` drafts tokens for the decoding sequences. A proposer that writes state past
   the computed length reserves it with :meth:`ProposerContext.reserve` (the verify step needs those
   blocks anyway), builds its steps' batches with :meth:`ProposerContext.draft_batch` and runs them with
   :meth:`ProposerContext.run`, which replays a captured graph per shape bucket like a decode step.

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


class DraftSequence(Protocol):
    """What a proposer sees of a sequence."""

    seq_id: int  # unique for the engine's lifetime
    token_ids: list[int]  # verified tokens: prompt, then output (never drafts)
    num_computed: int  # tokens whose target state is in the KV pools


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
