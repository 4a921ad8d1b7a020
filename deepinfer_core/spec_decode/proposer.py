"""The proposer contract (2.0) and its one-time resolution at engine build.

A draft round: after a step's sampling the engine asks the proposer for drafts of every running
sequence that is decoding (all its tokens but the last are computed) and stores them with the sequence.
The next schedule gives such a sequence ``1 + len(drafts)`` rows, the sampler verifies them (see
:mod:`deepinfer_core.spec_decode.verify`) and the output processor appends the accepted prefix plus one
token. Drafts are never part of ``token_ids``, so prefix-cache hashes and commits only ever see verified
tokens. What a proposer may use of the engine is its :class:`~.context.ProposerContext`.

A proposer returns, per sequence, either a list of tokens (deterministic given the context: ``q`` is one-hot
on each draft, and the verifier's draws are exactly those of plain sampling) or a :class:`~.context.Draft`
with the distribution ``q`` each token was sampled from (contract 2.1), which the verifier uses for
lossless rejection sampling (:mod:`deepinfer_core.spec_decode.verify`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deepinfer_core.config import ConfigError

if TYPE_CHECKING:
    from deepinfer_core.spec_decode.context import Draft, DraftSequence, ProposerContext, VerifiedRows

MAX_SPECULATIVE_TOKENS = 8


class Proposer(ABC):
    """Drafts up to :attr:`num_speculative_tokens` tokens per sequence."""

    num_speculative_tokens: int

    #: the target's hidden states are tapped for this proposer (:meth:`ProposerContext.last_hidden`)
    needs_hidden: bool = False

    def bind(self, ctx: ProposerContext) -> None:  # noqa: B027 - optional hook
        """Called once by the engine after it is built, with the proposer's context."""

    def observe(self, rows: list[VerifiedRows]) -> None:  # noqa: B027 - optional hook
        """Called after every target step, before :meth:`propose`, with the rows the step verified of each
        sequence still running (MTP catches its caches up here)."""

    @abstractmethod
    def propose(self, seqs: list[DraftSequence], limits: list[int]) -> list[list[int] | Draft]:
        """Drafts for each sequence in ``seqs``, at most ``limits[i]`` (<= k) tokens for sequence ``i``:
        a list of tokens (one-hot ``q``), or a :class:`Draft` with the distribution they were sampled from
        (2.1). A proposer that writes state past the computed length (MTP's chained steps) reserves it
        with :meth:`ProposerContext.reserve`; the verify step reuses those blocks."""


def build_proposer(
    spec: Mapping[str, Any] | None, factories: Mapping[str, Callable[..., Proposer]], model: Any, config: Any
) -> Proposer | None:
    """Resolve ``speculative_config`` once: validate ``num_speculative_tokens`` and call the factory
    registered for ``method`` as ``factory(model, spec, config)``."""
    if not spec:
        return None
    method = spec.get("method")
    if method not in factories:
        raise ConfigError(
            f"speculative_config.method={method!r} is invalid: installed proposers: "
            f"{sorted(factories) or 'none'} (speculative decoding needs the deepinfer-spec-decode plugin)"
        )
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(
            f"speculative_config.num_speculative_tokens={k!r} is invalid: need an integer in "
            f"1..{MAX_SPECULATIVE_TOKENS}"
        )
    limit = spec.get("disable_by_batch_size")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigError(
            f"speculative_config.disable_by_batch_size={limit!r} is invalid: need an integer >= 1 (the most "
            "running sequences that still get drafts), or absent"
        )
    proposer = factories[method](model, dict(spec), config)
    if not isinstance(proposer, Proposer):
        raise ConfigError(f"speculative_config.method={method!r}: its factory did not return a Proposer")
    return proposer
