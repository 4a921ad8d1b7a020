"""The example plugin's grammar backend (``example_choice``): which constraints it takes, the masks its
matcher gives, and rollback, on the demo checkpoint's vocabulary."""

from __future__ import annotations

import pytest

from deepinfer_core.structured import GrammarCache, allocate_bitmask, unpack_bitmask
from deepinfer_example_backend.grammar import ChoiceBackend, literal_alternatives

from .conftest import EOS, VOCAB


@pytest.fixture(scope="module")
def backend(demo_tokenizer):
    return ChoiceBackend(demo_tokenizer, VOCAB, stop_token_ids=[EOS], cache=GrammarCache())


def allowed(matcher) -> set[int]:
    mask = allocate_bitmask(1, VOCAB)
    matcher.fill_bitmask(mask, 0)
    return set(unpack_bitmask(mask, VOCAB)[0].nonzero().flatten().tolist())


def test_literal_regexes_are_alternatives_with_escapes():
    assert literal_alternatives(r"yes|no|a\.b|x\|y") == ["yes", "no", "a.b", "x|y"]


@pytest.mark.parametrize("pattern", ["a+", "[ab]", r"\d", "a||b", "(yes)"])
def test_a_regex_that_is_not_literal_is_refused(backend, pattern):
    with pytest.raises(ValueError, match="example_choice"):
        backend.compile({"regex": pattern})


def test_other_constraint_kinds_are_refused_at_compile(backend):
    with pytest.raises(ValueError, match="choice and literal regex constraints; got json"):
        backend.compile({"json": {"type": "string"}})


def test_a_character_no_token_spells_is_refused(backend, demo_tokenizer):
    assert len(demo_tokenizer.encode("日", add_special_tokens=False)) > 1  # bytes, not a character token
    with pytest.raises(ValueError, match="cannot spell '日'"):
        backend.compile({"choice": ["日本"]})


def test_masks_follow_the_text_and_allow_eos_exactly_where_an_alternative_ends(backend, demo_tokenizer):
    alternatives = ("gam", "gamma ray", "beta")
    m = backend.matcher(backend.compile({"choice": list(alternatives)}))
    first = allowed(m)
    texts = {demo_tokenizer.decode([t]) for t in first}
    assert EOS not in first and {"g", "b"} <= texts
    assert all(any(alt.startswith(s) for alt in alternatives) for s in texts)
    for t in demo_tokenizer.encode("gam", add_special_tokens=False):
        assert m.accept_token(t)
    after = allowed(m) - {EOS}
    assert EOS in allowed(m) and after and all("ma ray".startswith(demo_tokenizer.decode([t])) for t in after)
    assert not m.is_terminated() and m.accept_token(EOS) and m.is_terminated()
    assert not m.accept_token(EOS)


def test_a_forbidden_token_is_refused_without_changing_the_state(backend, demo_tokenizer):
    m = backend.matcher(backend.compile({"choice": ["beta"]}))
    before = allowed(m)
    for t in (EOS, 2, demo_tokenizer.encode("x", add_special_tokens=False)[0]):
        assert not m.accept_token(t)
    assert allowed(m) == before


def test_rows_never_allow_added_tokens(backend):
    m = backend.matcher(backend.compile({"choice": ["a", "b", "<"]}))
    assert m.excludes_added_tokens and not allowed(m) & {0, 2, 3}


def test_rollback_restores_each_earlier_state(backend, demo_tokenizer):
    m = backend.matcher(backend.compile({"regex": "alpha beta|alphabet"}))
    tokens = [*demo_tokenizer.encode("alpha beta", add_special_tokens=False), EOS]
    states = []
    for t in tokens:
        states.append(allowed(m))
        assert m.accept_token(t)
    for n in (1, 2, len(tokens)):
        m.rollback(n)
        assert allowed(m) == states[len(tokens) - n] and not m.is_terminated()
        for t in tokens[len(tokens) - n :]:
            assert m.accept_token(t)
    with pytest.raises(ValueError, match="cannot roll back"):
        m.rollback(len(tokens) + 1)
    m.reset()
    assert allowed(m) == states[0]
