"""The llguidance backend (``structured_outputs_backend="llguidance"``, and ``auto``'s fallback)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

import torch

try:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llg_torch
except ImportError as e:  # pragma: no cover - exercised only where llguidance is missing
    raise ImportError(
        f"the llguidance structured-output backend needs the llguidance package ({e}): pip install llguidance"
    ) from e

from deepinfer_core.plugin_api import (
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    GrammarVocab,
    StructuredConstraint,
)
from deepinfer_structured.xgrammar_backend import lark_choice

_TOKENIZERS: dict[str, llguidance.LLTokenizer] = {}  # by vocabulary fingerprint: building one takes ~1 s
_TOKENIZERS_LOCK = threading.Lock()


def ll_tokenizer(vocab: GrammarVocab) -> llguidance.LLTokenizer:
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(vocab.fingerprint)
        if tok is None:
            tok = _TOKENIZERS[vocab.fingerprint] = llguidance.hf.from_tokenizer(
                vocab.tokenizer, n_vocab=vocab.vocab_size, eos_token=list(vocab.stop_token_ids)
            )
        return tok


class LLGuidanceMatcher(GrammarMatcher):
    """Two llguidance behaviours shape this class:

    - a rejected token puts ``LLMatcher`` in a permanent error state, so tokens are tried with
      ``try_consume_tokens``, which leaves the state alone on failure;
    - rolling back a consumed EOS leaves it no longer accepting (llguidance 1.9), so the stop token is
      never passed to it: accepting one in an accepting state is recorded here as termination, and a
      rollback over it only clears that record.
    """

    backend_name = "llguidance"

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, stop_token_ids: Sequence[int]):
        self.native = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self.native.is_error():
            raise ValueError(f"llguidance rejected the grammar: {self.native.get_error()}")
        self._stops = frozenset(stop_token_ids)
        self._terminated = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        llg_torch.fill_next_token_bitmask(self.native, bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self._stops:
            self._terminated = self.native.is_accepting()
            return self._terminated
        return self.native.try_consume_tokens([token_id]) == 1

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens and not self.native.rollback(num_tokens):
            raise RuntimeError(
                f"llguidance could not roll back {num_tokens} tokens: {self.native.get_error()}"
            )

    def is_terminated(self) -> bool:
        return self._terminated

    def reset(self) -> None:
        self.native.reset()
        self._terminated = False


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size=None, *, stop_token_ids=None, cache=None):
        super().__init__(tokenizer, vocab_size, stop_token_ids=stop_token_ids, cache=cache)
        self.tokenizer = ll_tokenizer(self.vocab)
        # the executor uses 80% of the CPUs; with one worker thread it only adds a hand-off
        self._executor = llguidance.LLExecutor() if (os.cpu_count() or 1) > 2 else None

    def _compile(self, c: StructuredConstraint) -> CompiledGrammar:
        try:
            grammar = self._grammar_text(c)
        except ValueError as e:
            raise ValueError(f"invalid {c.kind} constraint for llguidance: {e}") from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise ValueError(f"invalid {c.kind} constraint for llguidance: {messages[0]}")
        return CompiledGrammar(c, self.name, grammar)

    @staticmethod
    def _grammar_text(c: StructuredConstraint) -> str:
        if c.kind in ("json", "json_object"):
            options = {"whitespace_flexible": not c.disable_any_whitespace}
            return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(c.schema()), defaults=options)
        if c.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(c.spec)
        if c.kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(lark_choice(c.choices()))
        return llguidance.grammar_from("grammar", c.spec)  # Lark, or GBNF converted to Lark

    def matcher(self, grammar: CompiledGrammar) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.tokenizer, grammar.native, self.vocab.stop_token_ids)

    def fill_bitmasks(self, matchers, bitmask, rows) -> None:
        if len(matchers) == 1 or self._executor is None:
            super().fill_bitmasks(matchers, bitmask, rows)
            return
        llg_torch.fill_next_token_bitmask_par(
            self._executor, [(m.native, r) for m, r in zip(matchers, rows)], bitmask
        )
