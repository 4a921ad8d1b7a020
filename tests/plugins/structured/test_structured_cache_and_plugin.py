"""Compiled grammars are cached by (backend, vocabulary, constraint); the plugin registers its
backends through the core's hook; the manager builds its backend only when first needed."""

from __future__ import annotations

import pytest

from deepinfer_core.runtime import build_registry
from deepinfer_core.structured import GrammarCache, StructuredOutputManager

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_same_constraint_compiles_once(v4_tokenizer, backends, backend_name):
    cls = type(backends[backend_name])
    cache = GrammarCache()
    backend = cls(backends["xgrammar"].vocab, cache=cache)
    first = backend.compile({"json": SCHEMA})
    assert (
        backend.compile(
            {"json": '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'}
        )
        is first
    )
    assert (cache.hits, cache.misses) == (1, 1)
    assert backend.compile({"json": SCHEMA, "disable_any_whitespace": True}) is not first
    assert backend.compile({"regex": "a+"}) is backend.compile({"regex": "a+"})
    assert len(cache) == 3


def test_cache_is_keyed_by_vocabulary_so_engines_with_one_tokenizer_share_it(v4_tokenizer):
    from deepinfer_structured.xgrammar_backend import XGrammarBackend

    cache = GrammarCache()
    a = XGrammarBackend(v4_tokenizer, 129280, stop_token_ids=[1], cache=cache)
    b = XGrammarBackend(v4_tokenizer, 129280, stop_token_ids=[1], cache=cache)
    other = XGrammarBackend(v4_tokenizer, 129280, stop_token_ids=[1, 128805], cache=cache)
    assert b.compile({"choice": ["x", "y"]}) is a.compile({"choice": ["x", "y"]})
    assert other.compile({"choice": ["x", "y"]}) is not a.compile({"choice": ["x", "y"]})


def test_cache_evicts_least_recently_used():
    cache = GrammarCache(max_entries=2)
    cache.put(("a",), "A")
    cache.put(("b",), "B")
    assert cache.get(("a",)) == "A"
    cache.put(("c",), "C")
    assert cache.get(("b",)) is None and cache.get(("a",)) == "A" and len(cache) == 2


def test_plugin_registers_three_backends_through_the_entry_point():
    import deepinfer_structured.plugin as plugin

    reg = build_registry(allow=["structured"])
    assert plugin.DEEPINFER_PLUGIN_API == "2.0"
    assert [p.name for p in reg.report.loaded] == ["structured"]
    assert set(reg.structured_backends) == {"xgrammar", "llguidance", "auto"}
    assert reg.structured_backends.owners["auto"] == "structured"
    assert reg.structured_backends["llguidance"].__name__ == "LLGuidanceBackend"


def test_manager_from_registry_builds_the_configured_backend_on_first_use(v4_tokenizer):
    from deepinfer_core.config import EngineConfig

    reg = build_registry(allow=["structured"])
    manager = StructuredOutputManager.from_registry(
        reg, EngineConfig(structured_outputs_backend="auto"), v4_tokenizer, 129280, [1]
    )
    assert manager._backend is None
    assert manager.validate_and_compile("r", None) is False and manager._backend is None
    assert manager.validate_and_compile("r", {"regex": "[0-9]"}) is True
    assert type(manager.backend).__name__ == "AutoBackend"


def test_no_plugin_means_a_clear_error_at_submission(v4_tokenizer):
    from deepinfer_core.config import EngineConfig

    reg = build_registry(allow=[])
    manager = StructuredOutputManager.from_registry(reg, EngineConfig(), v4_tokenizer, 129280, [1])
    with pytest.raises(ValueError, match="structured outputs need the deepinfer-structured plugin"):
        manager.validate_and_compile("r", {"choice": ["a"]})
