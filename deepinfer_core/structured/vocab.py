"""What the grammar layer needs to know about the tokenizer, computed once per engine.

Constrained text is made of ordinary tokens only. The tokenizer's added tokens (chat markers,
``<think>``, placeholders, BOS) never appear inside it; only a stop token ends it. Backends differ
here (xgrammar would allow BOS and placeholder tokens inside a JSON string, llguidance a few DSML
markers), so the manager enforces the rule itself with :meth:`GrammarVocab.text_bitmask`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from deepinfer_core.structured.bitmask import bitmask_of_ids, bitmask_width, pack_allowed

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True, eq=False)
class GrammarVocab:
    tokenizer: Any  # a transformers PreTrainedTokenizerFast
    vocab_size: int  # the model's logits width; may exceed the tokenizer's size (padding rows)
    stop_token_ids: tuple[int, ...]
    control_token_ids: frozenset[int]  # added tokens other than the stop tokens
    known_token_ids: frozenset[int]  # every id the tokenizer defines
    think_start_id: int | None
    think_end_id: int | None
    fingerprint: str  # equal for equal vocabularies, added tokens, stop tokens and vocab_size

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, vocab_size: int | None = None, stop_token_ids: Iterable[int] | None = None
    ) -> GrammarVocab:
        """:param stop_token_ids: the tokens that end a request (default: the tokenizer's EOS).
        :raises ValueError: when there is no stop token to end constrained text with."""
        vocab: dict[str, int] = tokenizer.get_vocab()
        size = vocab_size or max(len(vocab), max(vocab.values()) + 1)
        if stop_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            stop_token_ids = [] if eos is None else [eos]
        stops = tuple(sorted(set(int(t) for t in stop_token_ids)))
        if not stops:
            raise ValueError(
                "structured outputs need a stop token: pass stop_token_ids (the tokenizer has no EOS)"
            )
        added = _added_token_ids(tokenizer)
        return cls(
            tokenizer=tokenizer,
            vocab_size=size,
            stop_token_ids=stops,
            control_token_ids=frozenset(i for i in added if i < size and i not in stops),
            known_token_ids=frozenset(i for i in vocab.values() if i < size),
            think_start_id=vocab.get(THINK_START),
            think_end_id=vocab.get(THINK_END),
            fingerprint=_fingerprint(vocab, size, stops, added),
        )

    @property
    def width(self) -> int:
        return bitmask_width(self.vocab_size)

    @cached_property
    def text_bitmask(self) -> torch.Tensor:
        """``[W]``: tokens that may appear in constrained output: ordinary tokens and the stop tokens."""
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        allowed[torch.tensor(sorted(self.known_token_ids))] = True
        if self.control_token_ids:
            allowed[torch.tensor(sorted(self.control_token_ids))] = False
        allowed[torch.tensor(self.stop_token_ids)] = True
        return pack_allowed(allowed)

    @cached_property
    def stop_bitmask(self) -> torch.Tensor:
        """``[W]``: only the stop tokens (the row of a request whose grammar has terminated)."""
        return bitmask_of_ids(self.stop_token_ids, self.vocab_size)

    @cached_property
    def reasoning_bitmask(self) -> torch.Tensor:
        """``[W]``: anything but a stop token (a request still inside its ``<think>`` block)."""
        allowed = torch.ones(self.vocab_size, dtype=torch.bool)
        allowed[torch.tensor(self.stop_token_ids)] = False
        return pack_allowed(allowed)


def _added_token_ids(tokenizer: Any) -> set[int]:
    if hasattr(tokenizer, "get_added_vocab"):
        return set(tokenizer.get_added_vocab().values())
    return set(getattr(tokenizer, "added_tokens_decoder", {}) or {})


def _fingerprint(vocab: dict[str, int], size: int, stops: tuple[int, ...], added: set[int]) -> str:
    h = hashlib.sha256(f"{size}|{stops}|{sorted(added)}|".encode())
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\x00{token}\x01".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]
