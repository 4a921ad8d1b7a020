"""The grammar-backend contract: a backend compiles constraints; a matcher tracks one request.

Backends come from plugins (``deepinfer_register_structured_backends``); the registered factory is
called as ``factory(tokenizer, vocab_size, stop_token_ids=..., cache=...)`` (or with a ready
:class:`GrammarVocab` as ``tokenizer``). Nothing here imports a grammar library.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_core.structured.constraint import StructuredConstraint, constraint_from_params
from deepinfer_core.structured.vocab import GrammarVocab


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A constraint compiled for one vocabulary; immutable and shared by every request using it."""

    constraint: StructuredConstraint
    backend: str  # the name of the backend that compiled it (``auto`` records the one that succeeded)
    native: Any  # the library's object


class GrammarMatcher(ABC):
    """One request's position in its grammar. Token ids in, bitmask rows out; no text.

    Invariant the manager relies on: a token for which ``accept_token`` returns False leaves the state
    unchanged, and ``rollback(n)`` undoes exactly the last ``n`` accepted tokens (the stop token included).
    """

    #: True when rows never allow the vocabulary's added tokens (other than stop tokens), so the manager
    #: can skip its own filter (:attr:`GrammarVocab.text_bitmask`) for this matcher's rows.
    excludes_added_tokens: bool = False

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]`` (CPU int32 ``[R, W]``, contiguous).
        Only called while not terminated."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by ``token_id``; False (and no change) if the grammar does not allow it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token has been accepted at a point where the grammar is complete."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the start of the grammar."""


class GrammarBackend(ABC):
    """Compiles constraints for one vocabulary and makes matchers. Subclasses implement
    :meth:`_compile` and :meth:`matcher`; they may override :meth:`fill_bitmasks` to fill many rows
    in parallel."""

    name: str = "?"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        *,
        stop_token_ids: Iterable[int] | None = None,
        cache: GrammarCache | None = None,
    ):
        self.vocab = (
            tokenizer
            if isinstance(tokenizer, GrammarVocab)
            else GrammarVocab.from_tokenizer(tokenizer, vocab_size, stop_token_ids)
        )
        self.cache = cache if cache is not None else SHARED_CACHE

    def compile(self, constraint: Any) -> CompiledGrammar:
        """Compile (or fetch from the cache, keyed by constraint and vocabulary fingerprint).

        :raises ValueError: the constraint is malformed or this backend cannot enforce it."""
        c = constraint_from_params(constraint)
        key = (self.name, self.vocab.fingerprint, c.key)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        compiled = self._compile(c)
        self.cache.put(key, compiled)
        return compiled

    @abstractmethod
    def _compile(self, constraint: StructuredConstraint) -> CompiledGrammar:
        """Compile ``constraint``; raise ValueError with the library's reason when it is rejected."""

    @abstractmethod
    def matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        """A fresh matcher at the start of ``grammar``."""

    def fill_bitmasks(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """Fill ``bitmask[rows[i]]`` from ``matchers[i]``; all matchers come from this backend."""
        for m, r in zip(matchers, rows):
            m.fill_bitmask(bitmask, r)


class GrammarCache:
    """A thread-safe LRU of compiled grammars, keyed by ``(backend, vocabulary fingerprint, constraint)``."""

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self._items: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> CompiledGrammar | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item

    def put(self, key: tuple, item: CompiledGrammar) -> None:
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


#: Shared by every backend built without an explicit cache: engines with the same tokenizer reuse grammars.
SHARED_CACHE = GrammarCache()
