"""One request's grammar state: its matcher plus the reasoning phase that precedes it.

Reasoning rule: when the prompt leaves a ``<think>`` block open (V4's thinking modes end the prompt
with ``<think>``), the constraint applies to the answer only. Until the model emits the ``</think>``
token every token but a stop token is allowed (a request cannot end without its answer); the token
after ``</think>`` is the grammar's first. Rollback may cross ``</think>`` in either direction.
"""

from __future__ import annotations

import torch

from deepinfer_core.structured.backend import CompiledGrammar, GrammarMatcher
from deepinfer_core.structured.vocab import GrammarVocab

_REASON, _CLOSE, _GRAMMAR = 0, 1, 2  # what each accepted token did


class RequestGrammar:
    def __init__(
        self, grammar: CompiledGrammar, matcher: GrammarMatcher, vocab: GrammarVocab, reasoning: bool
    ):
        self.grammar = grammar
        self.matcher = matcher
        self.vocab = vocab
        self.reasoning = reasoning
        self._history: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self._history)

    @property
    def terminated(self) -> bool:
        return not self.reasoning and self.matcher.is_terminated()

    def fill_fixed_row(self, bitmask: torch.Tensor, row: int) -> bool:
        """Fill ``bitmask[row]`` when the matcher is not needed (reasoning, or terminated); False otherwise."""
        if self.reasoning:
            bitmask[row] = self.vocab.reasoning_bitmask
        elif self.matcher.is_terminated():
            bitmask[row] = self.vocab.stop_bitmask
        else:
            return False
        return True

    def advance(self, token_id: int) -> bool:
        """Accept one token; False (state unchanged) if the grammar (or the reasoning rule) forbids it."""
        if self.reasoning:
            if token_id in self.vocab.stop_token_ids:
                return False
            closes = token_id == self.vocab.think_end_id
            self._history.append(_CLOSE if closes else _REASON)
            self.reasoning = not closes
            return True
        if not self.matcher.accept_token(token_id):
            return False
        self._history.append(_GRAMMAR)
        return True

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens: only {len(self._history)} were accepted")
        if num_tokens == 0:
            return
        undone = self._history[-num_tokens:]
        del self._history[-num_tokens:]
        grammar_tokens = undone.count(_GRAMMAR)
        if grammar_tokens:
            self.matcher.rollback(grammar_tokens)
        if _CLOSE in undone:
            self.reasoning = True
