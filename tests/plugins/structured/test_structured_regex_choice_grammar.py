"""Regex, choice and grammar constraints under a random-weight model, on each backend."""

from __future__ import annotations

import ast
import re

import pytest

from .structured_sim import generate

BACKENDS = ["xgrammar", "llguidance"]
REGEXES = [
    r"[a-z]{3,8}",
    r"\d{3}-\d{4}",
    r"(cat|dog|bird)s?",
    r"[A-Z][a-z]{0,6}( [A-Z][a-z]{0,6}){0,2}",
    r"(0|[1-9][0-9]{0,3})\.[0-9]{2}",
    r"#[0-9a-f]{6}",
    r"(yes|no|maybe)!{0,3}",
    r"[^\n\"]{1,12}",
]
CHOICES = ["apple", "apples", 'a"quote', "back\\slash", "new\nline", "ünïcødé", "(a|b)*", "日本語"]
ARITH = r"""
start: expr
expr: term | term OP term | term OP term OP term
term: NUMBER | "(" expr ")" | "-" NUMBER
OP: "+" | "-" | "*" | "/"
NUMBER: /[1-9][0-9]{0,2}|0/
"""
PAIRS = r"""
start: pair (";" pair)~0..2
pair: KEY "=" VALUE
KEY: /[a-z]{1,6}/
VALUE: /[0-9]{1,4}/ | "true" | "false"
"""
CSV_GBNF = 'root ::= word ("," word){0,3}\nword ::= [a-z]{1,5}'
NESTED_GBNF = 'root ::= "[" ( item ( "," item ){0,2} )? "]"\nitem ::= "x" | "yy" | root'
SEEDS = range(4)


def run(manager, params_by_name, max_tokens=96):
    reqs = {f"{n}/{s}": p for n, p in params_by_name.items() for s in SEEDS}
    outs = generate(manager, reqs, {r: i for i, r in enumerate(reqs)}, max_tokens=max_tokens)
    tok = manager.vocab.tokenizer
    for rid, g in outs.items():
        assert g.finish_reason == "stop", f"{rid} did not finish: {tok.decode(g.tokens)!r}"
    return {rid: tok.decode(g.body) for rid, g in outs.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_regex_outputs_fully_match(make_manager, backend):
    texts = run(make_manager(backend), {rx: {"regex": rx} for rx in REGEXES})
    for rid, text in texts.items():
        assert re.fullmatch(rid.rsplit("/", 1)[0], text), (rid, text)


@pytest.mark.parametrize("backend", [*BACKENDS, "example_choice"])
def test_choice_outputs_are_one_of_the_choices(make_manager, backend):
    manager = make_manager(backend)
    reqs = {f"c/{s}": {"choice": CHOICES} for s in range(24)}
    outs = generate(manager, reqs, {r: 7 * i for i, r in enumerate(reqs)}, max_tokens=16)
    picked = [manager.vocab.tokenizer.decode(g.body) for g in outs.values()]
    assert all(g.finish_reason == "stop" for g in outs.values())
    assert set(picked) <= set(CHOICES) and len(set(picked)) >= 3, picked


def _check_arith(text: str) -> None:
    tree = ast.parse(text, mode="eval")
    allowed = (
        ast.Expression,
        ast.BinOp,
        ast.UnaryOp,
        ast.Constant,
        ast.Add,
        ast.Sub,
        ast.Mult,
        ast.Div,
        ast.USub,
    )
    assert all(isinstance(n, allowed) for n in ast.walk(tree)), text
    assert re.fullmatch(r"[0-9()+\-*/]+", text), text


def _check_pairs(text: str) -> None:
    assert re.fullmatch(
        r"[a-z]{1,6}=([0-9]{1,4}|true|false)(;[a-z]{1,6}=([0-9]{1,4}|true|false)){0,2}", text
    ), text


def _check_nested(text: str) -> None:
    value = ast.literal_eval(re.sub(r"(x|yy)", r"'\1'", text))  # balanced brackets and commas
    assert isinstance(value, list), text

    def depth_ok(v):
        return len(v) <= 3 and all(depth_ok(i) for i in v if isinstance(i, list))

    assert depth_ok(value), text


GRAMMARS = {
    "arith": (ARITH, _check_arith),
    "pairs": (PAIRS, _check_pairs),
    "csv_gbnf": (CSV_GBNF, lambda t: re.fullmatch(r"[a-z]{1,5}(,[a-z]{1,5}){0,3}", t) or pytest.fail(t)),
    "nested_gbnf": (NESTED_GBNF, _check_nested),
}


@pytest.fixture(scope="module", params=BACKENDS)
def grammar_outputs(request, backends, v4_tokenizer):
    """``{"<grammar>/<seed>": text}`` generated once per backend for the two grammar tests below."""
    from deepinfer_core.structured import StructuredOutputManager

    backend = backends[request.param]
    manager = StructuredOutputManager({"b": lambda *a, **k: backend}, "b", v4_tokenizer, 129280, [1])
    return run(manager, {n: {"grammar": g} for n, (g, _) in GRAMMARS.items()}, max_tokens=128)


def test_grammar_outputs_parse(grammar_outputs):
    for rid, text in grammar_outputs.items():
        GRAMMARS[rid.split("/")[0]][1](text)


def test_lark_grammar_outputs_parse_with_lark(grammar_outputs):
    lark = pytest.importorskip("lark")
    for name in ("arith", "pairs"):
        parser = lark.Lark(GRAMMARS[name][0], parser="earley")
        for rid, text in grammar_outputs.items():
            if rid.startswith(name + "/"):
                parser.parse(text)
