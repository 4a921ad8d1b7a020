"""The xgrammar backend (the default).

The tokenizer info marks every added token other than the stop tokens as special, which xgrammar
never allows inside text (by default it would let BOS or placeholder tokens into a JSON string).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence

import torch
import xgrammar as xgr

from deepinfer_core.plugin_api import (
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    GrammarVocab,
    StructuredConstraint,
)
from deepinfer_structured.schema_support import unenforced_keywords

_INFOS: dict[str, xgr.TokenizerInfo] = {}  # by vocabulary fingerprint: building one takes ~0.4 s
_INFOS_LOCK = threading.Lock()
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def tokenizer_info(vocab: GrammarVocab) -> xgr.TokenizerInfo:
    with _INFOS_LOCK:
        info = _INFOS.get(vocab.fingerprint)
        if info is None:
            info = _INFOS[vocab.fingerprint] = _build_info(vocab)
        return info


def _build_info(vocab: GrammarVocab) -> xgr.TokenizerInfo:
    stops = list(vocab.stop_token_ids)
    detected = xgr.TokenizerInfo.from_huggingface(
        vocab.tokenizer, vocab_size=vocab.vocab_size, stop_token_ids=stops
    )
    encoded = [""] * vocab.vocab_size  # "" = special: never allowed in text
    for token, idx in vocab.tokenizer.get_vocab().items():
        if idx < vocab.vocab_size and idx not in vocab.control_token_ids:
            encoded[idx] = token
    return xgr.TokenizerInfo(
        encoded,
        detected.vocab_type,
        vocab_size=vocab.vocab_size,
        stop_token_ids=stops,
        add_prefix_space=detected.add_prefix_space,
    )


def lark_choice(choices: list[str]) -> str:
    """A Lark grammar matching exactly one of ``choices`` (JSON string escapes are Lark's too)."""
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def is_gbnf(grammar: str) -> bool:
    """GBNF/EBNF (``root ::= ...``) rather than Lark (``start: ...``)."""
    return "::=" in grammar


class XGrammarMatcher(GrammarMatcher):
    backend_name = "xgrammar"
    excludes_added_tokens = True  # they are special in the tokenizer info (see tokenizer_info)

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int]):
        self.native = xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.native.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        return self.native.accept_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.native.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.native.is_terminated()

    def reset(self) -> None:
        self.native.reset()


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size=None, *, stop_token_ids=None, cache=None, max_threads: int = 8):
        super().__init__(tokenizer, vocab_size, stop_token_ids=stop_token_ids, cache=cache)
        self.info = tokenizer_info(self.vocab)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads)
        self._batch = xgr.BatchGrammarMatcher()

    def _compile(self, c: StructuredConstraint) -> CompiledGrammar:
        if c.kind in ("json", "json_object"):
            ignored = unenforced_keywords(c.schema())
            if ignored:
                raise ValueError(
                    f"xgrammar cannot enforce the JSON schema keyword(s) at {', '.join(ignored)}; "
                    'use structured_outputs_backend="llguidance" or "auto", or drop them'
                )
        try:
            native = self._compile_native(c)
        except RuntimeError as e:
            raise ValueError(f"invalid {c.kind} constraint for xgrammar: {_clean(e)}") from None
        return CompiledGrammar(c, self.name, native)

    def _compile_native(self, c: StructuredConstraint) -> xgr.CompiledGrammar:
        if c.kind in ("json", "json_object"):
            compact = c.disable_any_whitespace
            return self.compiler.compile_json_schema(
                json.dumps(c.schema()), any_whitespace=not compact, separators=(",", ":") if compact else None
            )
        if c.kind == "regex":
            return self.compiler.compile_regex(c.spec)
        if c.kind == "choice":
            return self.compiler.compile_lark(lark_choice(c.choices()))
        if is_gbnf(c.spec):
            return self.compiler.compile_grammar(xgr.Grammar.from_ebnf(c.spec))
        return self.compiler.compile_lark(c.spec)

    def matcher(self, grammar: CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(grammar.native, self.vocab.stop_token_ids)

    def fill_bitmasks(self, matchers, bitmask, rows) -> None:
        if len(matchers) == 1:
            matchers[0].fill_bitmask(bitmask, rows[0])
            return
        self._batch.batch_fill_next_token_bitmask([m.native for m in matchers], bitmask, list(rows))


def _clean(error: Exception) -> str:
    """xgrammar's message without its C++ log prefix (time and source line)."""
    return _LOG_PREFIX.sub("", str(error).strip())
