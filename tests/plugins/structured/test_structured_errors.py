"""Bad constraints fail at submission with the backend's reason, and leave the manager usable."""

from __future__ import annotations

import re
import unicodedata

import pytest

from deepinfer_core.structured import StructuredOutputError, StructuredOutputManager
from deepinfer_structured.schema_support import unenforced_keywords

from .structured_sim import generate

BAD = [
    ({"json": {"type": "foo"}}, {"xgrammar": 'Unsupported type "foo"', "llguidance": "Invalid type: foo"}),
    (
        {"json": {"type": "integer", "minimum": 5, "maximum": 3}},
        {"xgrammar": "minimum greater than maximum", "llguidance": "minimum (5) is greater than maximum (3)"},
    ),
    (
        {"json": {"$ref": "#/$defs/missing"}},
        {"xgrammar": "Cannot find field '$defs'", "llguidance": "/$defs/missing"},
    ),
    (
        {"json": {"type": "string", "pattern": "("}},
        {"xgrammar": "Regex parsing error", "llguidance": "unclosed group"},
    ),
    ({"regex": "(ab"}, {"xgrammar": "parenthesis is not closed", "llguidance": "unclosed group"}),
    (
        {"regex": "[z-a]"},
        {"xgrammar": "lower bound is larger than upper bound", "llguidance": "invalid character class range"},
    ),
    ({"grammar": "start: ("}, {"xgrammar": "Lark error", "llguidance": "grammar"}),
    ({"grammar": "root ::= ("}, {"xgrammar": "EBNF parser error", "llguidance": "Expected ')'"}),
    ({"grammar": "start: undefined_rule"}, {"xgrammar": "undefined_rule", "llguidance": "undefined_rule"}),
]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("params, reasons", BAD, ids=[str(p) for p, _ in BAD])
def test_invalid_constraint_raises_value_error_with_the_reason(make_manager, backend, params, reasons):
    manager = make_manager(backend)
    with pytest.raises(ValueError) as e:
        manager.validate_and_compile("bad", params)
    assert reasons[backend] in str(e.value)
    assert f"invalid {next(iter(params))} constraint for {backend}" in str(e.value)
    assert not manager.is_constrained("bad") and len(manager) == 0


@pytest.mark.parametrize("params", [{"choice": []}, {"json": "{oops"}, {"regex": "a", "grammar": "b"}])
def test_malformed_params_fail_before_any_backend_is_built(v4_tokenizer, params):
    built = []
    manager = StructuredOutputManager(
        {"xgrammar": lambda *a, **k: built.append(1)}, "xgrammar", v4_tokenizer, 129280, [1]
    )
    with pytest.raises(ValueError):
        manager.validate_and_compile("r", params)
    assert built == []


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
def test_engine_stays_usable_after_bad_constraints(make_manager, backend):
    manager = make_manager(backend)
    for params, _ in BAD:
        with pytest.raises(ValueError):
            manager.validate_and_compile("bad", params)
    out = generate(manager, {"ok": {"regex": "[0-9]{2}-[a-z]{2}"}}, {"ok": 0}, max_tokens=16)["ok"]
    assert out.finish_reason == "stop"
    assert re.fullmatch("[0-9]{2}-[a-z]{2}", manager.vocab.tokenizer.decode(out.body))


def test_xgrammar_refuses_keywords_it_would_silently_ignore(make_manager):
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "uniqueItems": True}},
        "not": {"required": ["x"]},
    }
    with pytest.raises(ValueError) as e:
        make_manager("xgrammar").validate_and_compile("r", {"json": schema})
    assert "#/properties/tags/uniqueItems" in str(e.value) and "#/not" in str(e.value)
    assert 'structured_outputs_backend="llguidance" or "auto"' in str(e.value)


def test_auto_reports_both_backends_when_neither_accepts(make_manager):
    with pytest.raises(ValueError) as e:
        make_manager("auto").validate_and_compile("r", {"json": {"type": "array", "uniqueItems": True}})
    text = str(e.value)
    assert "no backend accepts this constraint" in text and "xgrammar:" in text and "llguidance:" in text
    assert "uniqueItems" in text


def test_auto_falls_back_to_llguidance_for_a_schema_xgrammar_rejects(make_manager):
    schema = {"type": "string", "pattern": "^\\p{L}{1,6}$"}  # Unicode classes: llguidance only
    with pytest.raises(ValueError, match="Unic"):
        make_manager("xgrammar").validate_and_compile("r", {"json": schema})
    manager = make_manager("auto")
    assert manager.compile({"json": schema}).backend == "llguidance"
    assert manager.compile({"json": {"type": "integer"}}).backend == "xgrammar"
    reqs = {f"r{i}": {"json": schema} for i in range(4)} | {"plain": {"regex": "[a-c]{3}"}}
    outs = generate(manager, reqs, {r: i for i, r in enumerate(reqs)}, max_tokens=40)
    tok = manager.vocab.tokenizer
    for rid, g in outs.items():
        text = tok.decode(g.body)
        assert g.finish_reason == "stop"
        if rid == "plain":
            assert re.fullmatch("[a-c]{3}", text)
        else:
            value = text[1:-1]
            assert text[0] == text[-1] == '"' and 1 <= len(value) <= 6
            assert all(unicodedata.category(ch).startswith("L") for ch in value), text


def test_missing_backend_is_a_clear_error_only_for_constrained_requests(v4_tokenizer):
    manager = StructuredOutputManager({}, "xgrammar", v4_tokenizer, 129280, [1])
    assert manager.validate_and_compile("plain", None) is False
    assert manager.fill_bitmask(["plain"]) is None and manager.accept("plain", [5]) is False
    with pytest.raises(ValueError, match="'xgrammar' is not installed .*pip install deepinfer-structured"):
        manager.validate_and_compile("r", {"regex": "a"})


def test_duplicate_request_and_unmasked_token_are_errors(make_manager):
    manager = make_manager("xgrammar")
    manager.validate_and_compile("r", {"regex": "[0-9]+"})
    with pytest.raises(ValueError, match="already has a grammar"):
        manager.validate_and_compile("r", {"regex": "a"})
    letter = manager.vocab.tokenizer.encode("x", add_special_tokens=False)
    with pytest.raises(StructuredOutputError, match="bitmask must be applied"):
        manager.accept("r", letter)
    with pytest.raises(StructuredOutputError):
        manager.accept("r", [1])  # EOS before the grammar is complete


def test_unenforced_keyword_walk_follows_schema_structure():
    schema = {
        "type": "object",
        "properties": {
            "not": {"type": "string"},
            "if": {"enum": [{"not": 1}]},
            "n": {"type": "integer", "multipleOf": 5},
            "x": {"type": "number", "multipleOf": 0.5},
        },
        "$defs": {"d": {"anyOf": [{"type": "array", "items": {"uniqueItems": True}}]}},
    }
    assert unenforced_keywords(schema) == ["#/properties/x/multipleOf", "#/$defs/d/anyOf/0/items/uniqueItems"]
