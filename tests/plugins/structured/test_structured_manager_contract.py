"""The manager against a minimal third-party backend: what the GrammarBackend contract asks for."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.structured import (
    CompiledGrammar,
    GrammarBackend,
    GrammarCache,
    GrammarMatcher,
    StructuredOutputManager,
)
from deepinfer_core.structured.bitmask import bitmask_of_ids

V, EOS, THINK_END = 129280, 1, 128822


class SequenceMatcher(GrammarMatcher):
    """Accepts exactly the token ids of a regex-free 'grammar': a fixed list, then EOS."""

    def __init__(self, ids: list[int]):
        self.ids, self.pos, self.done = ids, 0, False

    def fill_bitmask(self, bitmask, row):
        nxt = self.ids[self.pos] if self.pos < len(self.ids) else EOS
        bitmask[row] = bitmask_of_ids([nxt], V)

    def accept_token(self, token_id):
        expected = self.ids[self.pos] if self.pos < len(self.ids) else EOS
        if self.done or token_id != expected:
            return False
        self.pos += token_id != EOS
        self.done = token_id == EOS
        return True

    def rollback(self, n):
        for _ in range(n):
            if self.done:
                self.done = False
            else:
                self.pos -= 1

    def is_terminated(self):
        return self.done

    def reset(self):
        self.pos, self.done = 0, False


class SequenceBackend(GrammarBackend):
    name = "sequence"

    def _compile(self, c):
        if c.kind != "choice":
            raise ValueError("sequence backend only takes choice=[ids as strings]")
        return CompiledGrammar(c, self.name, [int(x) for x in c.choices()])

    def matcher(self, grammar):
        return SequenceMatcher(grammar.native)


@pytest.fixture
def manager(v4_tokenizer):
    factories = {"sequence": lambda tok, size, **kw: SequenceBackend(tok, size, **kw)}
    return StructuredOutputManager(factories, "sequence", v4_tokenizer, V, [EOS], cache=GrammarCache())


def test_a_row_that_only_allows_an_added_token_keeps_it(manager):
    manager.validate_and_compile("r", {"choice": ["5", str(THINK_END)]})
    manager.accept("r", [5])
    row = manager.fill_bitmask(["r"])[0]
    assert torch.equal(row, bitmask_of_ids([THINK_END], V))  # not emptied by the added-token filter
    assert manager.accept("r", [THINK_END, EOS]) is True


def test_added_tokens_are_filtered_from_rows_that_allow_text_too(manager):
    manager.validate_and_compile("r", {"choice": ["5"]})
    assert torch.equal(manager.fill_bitmask(["r"])[0], bitmask_of_ids([5], V))
    manager.accept("r", [5])
    assert torch.equal(manager.fill_bitmask(["r"])[0], bitmask_of_ids([EOS], V))
    assert manager.accept("r", [EOS]) is True


def test_factory_must_return_a_grammar_backend(v4_tokenizer):
    manager = StructuredOutputManager({"x": lambda *a, **k: object()}, "x", v4_tokenizer, V, [EOS])
    with pytest.raises(TypeError, match="not a GrammarBackend"):
        manager.validate_and_compile("r", {"regex": "a"})


def test_a_backend_whose_library_is_missing_is_a_value_error(v4_tokenizer):
    def factory(*a, **k):
        raise ImportError("No module named 'somegrammarlib'")

    manager = StructuredOutputManager({"x": factory}, "x", v4_tokenizer, V, [EOS])
    with pytest.raises(ValueError, match="'x' cannot be used: No module named 'somegrammarlib'"):
        manager.validate_and_compile("r", {"regex": "a"})


def test_structured_outputs_without_a_tokenizer_is_a_value_error():
    manager = StructuredOutputManager({"sequence": SequenceBackend}, "sequence", None, V, [EOS])
    assert manager.validate_and_compile("plain", None) is False
    with pytest.raises(ValueError, match="need the model's tokenizer"):
        manager.validate_and_compile("r", {"choice": ["5"]})


def test_a_factory_with_the_two_argument_hook_signature_works(v4_tokenizer):
    seen = {}

    def factory(tokenizer, vocab_size):
        seen["args"] = (tokenizer, vocab_size)
        return SequenceBackend(tokenizer, vocab_size, stop_token_ids=[EOS], cache=GrammarCache())

    manager = StructuredOutputManager({"seq": factory}, "seq", v4_tokenizer, V, [EOS])
    assert manager.validate_and_compile("r", {"choice": ["5"]}) is True
    assert seen["args"] == (v4_tokenizer, V)


def test_the_engine_checks_a_backend_name_at_build_but_leaves_the_default_to_the_first_request():
    from deepinfer_core.config import ConfigError
    from deepinfer_core.structured import check_backend_name

    check_backend_name({"sequence": SequenceBackend}, "sequence")
    check_backend_name({}, "xgrammar")  # no grammar plugin: unconstrained requests still run
    with pytest.raises(
        ConfigError, match="'seq' is not installed; installed grammar backends: sequence, xgr"
    ):
        check_backend_name({"xgr": SequenceBackend, "sequence": SequenceBackend}, "seq")
