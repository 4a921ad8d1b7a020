"""The proposer contract and its one-time resolution at engine build.

A draft round: after a step's sampling the engine asks the proposer for drafts of every running
sequence that is decoding (all its tokens but the last are computed); it stores them on
``Sequence.spec_token_ids``. The next schedule gives such a sequence ``1 + len(drafts)`` rows, the sampler
verifies them (see :mod:`deepinfer_core.spec_decode.verify`) and the output processor appends the
accepted prefix plus one token. Drafts are never part of ``token_ids``, so prefix-cache hashes and
commits only ever see verified tokens.

Drafts are deterministic given the context (q is one-hot on the draft), which keeps rejection sampling
exact for any proposer that honours this contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deepinfer_core.config import ConfigError

if TYPE_CHECKING:
    from deepinfer_core.engine.scheduler import SchedulerOutput
    from deepinfer_core.engine.sequence import Sequence

MAX_SPECULATIVE_TOKENS = 8


class Proposer(ABC):
    """Drafts up to :attr:`num_speculative_tokens` tokens per sequence."""

    num_speculative_tokens: int

    def bind(self, engine: Any) -> None:  # noqa: B027 - optional hook
        """Called once by the engine after it is built (runner, KV manager); proposers that keep state
        in the engine's KV pools (MTP) take what they need here."""

    def observe(self, sched: SchedulerOutput) -> None:  # noqa: B027 - optional hook
        """Called after every target step, before :meth:`propose` (MTP catches its caches up here)."""

    @abstractmethod
    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        """Drafts for each sequence in ``seqs``, at most ``limits[i]`` (<= k) tokens for sequence ``i``.
        A proposer that writes state past the computed length (MTP's chained steps) allocates the blocks
        for it with ``kv.allocate(seq, limit)``; the verify step reuses them."""


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
    proposer = factories[method](model, dict(spec), config)
    if not isinstance(proposer, Proposer):
        raise ConfigError(f"speculative_config.method={method!r}: its factory did not return a Proposer")
    return proposer
