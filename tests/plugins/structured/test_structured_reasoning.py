"""Thinking mode: when the prompt leaves ``<think>`` open, the constraint applies to the answer after
``</think>``; until then anything but a stop token may be generated."""

from __future__ import annotations

import json

import pytest
import torch

from deepinfer_core.structured import StructuredOutputError, unpack_bitmask

from .structured_sim import EOS, V, generate

THINK, UNTHINK, USER, ASSISTANT = 128821, 128822, 128803, 128804
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
PARAMS = {"json": SCHEMA, "disable_any_whitespace": True}


def prompt(tokenizer, thinking: bool) -> list[int]:
    """V4's layout: ``<｜User｜>{q}<｜Assistant｜><think>`` (thinking) or ``...</think>`` (non-think)."""
    return [
        0,
        USER,
        *tokenizer.encode("Is it?", add_special_tokens=False),
        ASSISTANT,
        THINK if thinking else UNTHINK,
    ]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_answer_after_reasoning_block_follows_the_schema(make_manager, v4_tokenizer, backend):
    manager = make_manager(backend)
    reasoning = v4_tokenizer.encode("Let me think. It is, {not json} yet", add_special_tokens=False)
    reqs = {f"r{i}": PARAMS for i in range(4)}
    outs = generate(
        manager,
        reqs,
        {r: i for i, r in enumerate(reqs)},
        max_tokens=64,
        prompts={r: prompt(v4_tokenizer, True) for r in reqs},
        forced={r: reasoning + [UNTHINK] for r in reqs},
    )
    for g in outs.values():
        assert g.finish_reason == "stop"
        assert g.tokens[: len(reasoning) + 1] == reasoning + [UNTHINK]
        answer = v4_tokenizer.decode(g.body[len(reasoning) + 1 :])
        assert json.loads(answer)["answer"] in ("yes", "no")


def test_reasoning_rows_allow_everything_but_stop_tokens(make_manager, v4_tokenizer):
    manager = make_manager("xgrammar")
    manager.validate_and_compile("r", PARAMS, prompt(v4_tokenizer, True))
    allowed = unpack_bitmask(manager.fill_bitmask(["r"]), V)[0]
    assert not allowed[EOS] and int(allowed.sum()) == V - 1 and allowed[UNTHINK]
    with pytest.raises(StructuredOutputError):
        manager.accept("r", [EOS])  # a request cannot end before its answer
    assert manager.accept("r", [5, 6, UNTHINK]) is False
    grammar_row = unpack_bitmask(manager.fill_bitmask(["r"]), V)[0]
    assert set(v4_tokenizer.decode([t]) for t in grammar_row.nonzero().flatten().tolist()) <= {"{", '{"'}


@pytest.mark.parametrize(
    "thinking, reasoning, grammar_first",
    [(False, None, True), (True, None, False), (True, False, True), (False, True, False)],
)
def test_open_think_block_in_the_prompt_decides_where_the_grammar_starts(
    make_manager, v4_tokenizer, thinking, reasoning, grammar_first
):
    manager = make_manager("xgrammar")
    manager.validate_and_compile("r", PARAMS, prompt(v4_tokenizer, thinking), reasoning=reasoning)
    allowed = unpack_bitmask(manager.fill_bitmask(["r"]), V)[0]
    assert (int(allowed.sum()) < 10) is grammar_first


def test_prompt_without_markers_and_a_closed_earlier_block_start_in_the_grammar(make_manager, v4_tokenizer):
    manager = make_manager("xgrammar")
    earlier_turn = [THINK, 5, UNTHINK, 7, USER, 9, ASSISTANT]  # an earlier reasoning block, then no open one
    for rid, p in (("plain", [0, 5, 6]), ("closed", earlier_turn), ("none", None)):
        manager.validate_and_compile(rid, PARAMS, p)
    mask = unpack_bitmask(manager.fill_bitmask(["plain", "closed", "none"]), V)
    assert bool((mask.sum(-1) < 10).all())


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_rollback_across_the_end_of_reasoning(make_manager, v4_tokenizer, backend):
    manager = make_manager(backend)
    manager.validate_and_compile("r", PARAMS, prompt(v4_tokenizer, True))
    reasoning_mask = manager.fill_bitmask(["r"])
    brace = v4_tokenizer.encode("{", add_special_tokens=False)
    manager.accept("r", [11, UNTHINK, *brace])
    manager.rollback("r", 2)
    assert torch.equal(manager.fill_bitmask(["r"]), reasoning_mask)
    rows = manager.fill_bitmask_for_drafts("r", [UNTHINK, *brace])
    assert torch.equal(rows[0], reasoning_mask[0]) and int(unpack_bitmask(rows[1], V).sum()) < 10
    assert torch.equal(manager.fill_bitmask(["r"]), reasoning_mask)  # drafts left no trace
    answer = v4_tokenizer.encode('{"answer":"no"}', add_special_tokens=False)
    assert manager.accept("r", [UNTHINK, *answer, EOS]) is True
