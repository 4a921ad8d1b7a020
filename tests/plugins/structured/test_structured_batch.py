"""Batches: unconstrained rows are untouched, termination and max_tokens, and per-request isolation."""

from __future__ import annotations

import re

import pytest
import torch

from deepinfer_core.structured import unpack_bitmask

from .structured_sim import EOS, V, generate


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_unconstrained_requests_get_exactly_their_solo_output_in_a_mixed_batch(make_manager, backend):
    plain = {"p0": None, "p1": None}
    seeds = {"p0": 10, "p1": 11, "c0": 12, "c1": 13}
    solo = {
        rid: generate(make_manager(backend), {rid: None}, seeds, max_tokens=12)[rid].tokens for rid in plain
    }
    mixed = {**plain, "c0": {"regex": "[a-z]{20}"}, "c1": {"json": {"type": "boolean"}}}
    batch = generate(make_manager(backend), mixed, seeds, max_tokens=12)
    for rid in plain:
        assert batch[rid].tokens == solo[rid]
    assert batch["c1"].finish_reason == "stop"


def test_rows_of_unconstrained_requests_are_all_ones_and_none_means_no_mask(make_manager):
    manager = make_manager("xgrammar")
    manager.validate_and_compile("c", {"regex": "[0-9]"})
    assert manager.fill_bitmask(["a", "b"]) is None
    mask = manager.fill_bitmask(["a", "c", None])
    assert mask.shape == (3, (V + 31) // 32) and mask.dtype == torch.int32
    assert bool((mask[0] == -1).all()) and bool((mask[2] == -1).all())
    digits = unpack_bitmask(mask[1], V).nonzero().flatten().tolist()
    assert sorted(manager.vocab.tokenizer.decode([t]) for t in digits) == [str(d) for d in range(10)]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_terminal_state_allows_only_eos_and_finishes_with_stop(make_manager, backend):
    manager = make_manager(backend)
    manager.validate_and_compile("r", {"regex": "abc"})
    manager.validate_and_compile("open", {"regex": "ab(c)?"})
    tokens = manager.vocab.tokenizer.encode("abc", add_special_tokens=False)
    assert manager.accept("r", tokens) is False  # complete, but only the stop token ends it
    assert torch.equal(manager.fill_bitmask(["r"])[0], manager.vocab.stop_bitmask)
    assert manager.accept("r", [EOS]) is True and manager.is_terminated("r")
    manager.accept("open", manager.vocab.tokenizer.encode("ab", add_special_tokens=False))
    allowed = unpack_bitmask(manager.fill_bitmask(["open"]), V)[0]
    assert allowed[EOS] and int(allowed.sum()) > 1 and not manager.is_terminated("open")


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_output_cut_by_max_tokens_finishes_with_length_and_never_claims_completion(make_manager, backend):
    manager = make_manager(backend)
    params = {"regex": "[a-z]{30}"}
    outs = generate(manager, {"r": params}, {"r": 0}, max_tokens=4)
    assert outs["r"].finish_reason == "length" and EOS not in outs["r"].tokens
    text = manager.vocab.tokenizer.decode(outs["r"].tokens)
    assert re.fullmatch("[a-z]{4,29}", text)  # a valid prefix, not presented as complete
    assert len(manager) == 0


def test_requests_with_the_same_constraint_keep_separate_states(make_manager):
    manager = make_manager("xgrammar")
    for rid in ("a", "b"):
        manager.validate_and_compile(rid, {"choice": ["left", "right"]})
    tok = manager.vocab.tokenizer
    manager.accept("a", tok.encode("left", add_special_tokens=False))
    mask = unpack_bitmask(manager.fill_bitmask(["a", "b"]), V)
    assert mask[0].nonzero().flatten().tolist() == [EOS]
    assert mask[1, tok.encode("right", add_special_tokens=False)[0]]
    manager.free("a")
    assert not manager.is_constrained("a") and manager.accept("a", [5]) is False


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_parallel_batch_fill_equals_row_by_row_fill(backends, make_manager, backend, monkeypatch):
    from deepinfer_core.structured import GrammarBackend, allocate_bitmask

    be = backends[backend]
    if backend == "llguidance" and be._executor is None:  # small machines fill serially; test the pool too
        import llguidance

        monkeypatch.setattr(be, "_executor", llguidance.LLExecutor())
    manager = make_manager(backend)
    texts = ['{"a":', '{"a":1,"b":"x', "{", '{"a":12', '{"a":1,"b":"yy"', '{"a":3,"b":"z"}']
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    for i, text in enumerate(texts):
        manager.validate_and_compile(f"r{i}", {"json": schema, "disable_any_whitespace": True})
        manager.accept(f"r{i}", manager.vocab.tokenizer.encode(text, add_special_tokens=False))
    matchers = [manager._requests[f"r{i}"].matcher for i in range(len(texts))]
    rows = [5, 0, 3, 1, 4, 2]
    parallel, serial = allocate_bitmask(6, V), allocate_bitmask(6, V)
    be.fill_bitmasks(matchers, parallel, rows)
    GrammarBackend.fill_bitmasks(be, matchers, serial, rows)
    assert torch.equal(parallel, serial)
    assert len({tuple(r.tolist()) for r in parallel}) == 6
