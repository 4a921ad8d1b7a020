"""Rollback restores the exact grammar state; draft masking (speculative decoding) gives each draft
position the mask of the state the drafts before it lead to, and leaves the state untouched."""

from __future__ import annotations

import pytest
import torch

from .structured_sim import EOS, REFERENCE_OPS, V, generate

BACKENDS = ["xgrammar", "llguidance", "example_choice"]
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"type": "string", "maxLength": 5},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "tag", "ok"],
    "additionalProperties": False,
}
PARAMS = {"json": SCHEMA, "disable_any_whitespace": True}
#: the example third-party plugin's backend takes choices only: alternatives that share prefixes
CHOICES = {"choice": ["apple pie", "apple", "apricot jam", "banana split", "cherry tart"]}


def constraint(backend: str) -> dict:
    return CHOICES if backend == "example_choice" else PARAMS


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def sequence(make_manager, backend):
    """A complete constrained output (ending with EOS) and the mask before each of its tokens,
    computed the plain way: accept one token, fill, repeat."""
    out = generate(make_manager(backend), {"r": constraint(backend)}, {"r": 4}, max_tokens=64)["r"]
    assert out.finish_reason == "stop" and out.tokens[-1] == EOS
    manager = make_manager(backend)
    manager.validate_and_compile("r", constraint(backend))
    masks = []
    for t in out.tokens:
        masks.append(manager.fill_bitmask(["r"])[0])
        manager.accept("r", [t])
    return out.tokens, masks


def test_rollback_restores_the_state_of_the_shorter_prefix(make_manager, backend, sequence):
    tokens, masks = sequence
    n = len(tokens)
    for k, j in [(3, 1), (5, 5), (n - 1, 4), (n, 1), (n, 3), (n, n)]:
        manager = make_manager(backend)
        manager.validate_and_compile("r", constraint(backend))
        assert manager.accept("r", tokens[:k]) is (k == n)
        manager.rollback("r", j)
        assert not manager.is_terminated("r")
        assert torch.equal(manager.fill_bitmask(["r"])[0], masks[k - j]), (k, j)
        assert manager.accept("r", tokens[k - j :]) is True  # and it carries on to the same end


def test_rollback_past_the_start_is_an_error(make_manager, backend):
    manager = make_manager(backend)
    manager.validate_and_compile("r", constraint(backend))
    prefix = "apr" if backend == "example_choice" else '{"id'
    manager.accept("r", manager.vocab.tokenizer.encode(prefix, add_special_tokens=False))
    with pytest.raises(ValueError, match="cannot roll back"):
        manager.rollback("r", 99)


def test_draft_rows_equal_the_masks_of_the_states_they_lead_to(make_manager, backend, sequence):
    tokens, masks = sequence
    for start, k in [(0, 4), (2, 3), (len(tokens) - 4, 4), (len(tokens) - 2, 2)]:
        manager = make_manager(backend)
        manager.validate_and_compile("r", constraint(backend))
        manager.accept("r", tokens[:start])
        rows = manager.fill_bitmask_for_drafts("r", tokens[start : start + k])
        assert rows.shape == (k + 1, (V + 31) // 32)
        for j in range(k + 1):
            expected = masks[start + j] if start + j < len(masks) else manager.vocab.stop_bitmask
            assert torch.equal(rows[j], expected), (start, j)
        assert torch.equal(manager.fill_bitmask(["r"])[0], masks[start])  # the state is untouched
        assert manager.accept("r", tokens[start:]) is True


def test_rows_after_a_forbidden_draft_repeat_the_row_that_forbids_it(make_manager, backend, sequence):
    tokens, masks = sequence
    manager = make_manager(backend)
    manager.validate_and_compile("r", constraint(backend))
    bad = manager.vocab.tokenizer.encode("zz", add_special_tokens=False)[
        0
    ]  # never valid after the first token
    drafts = [tokens[0], bad, tokens[1], tokens[2]]
    rows = manager.fill_bitmask_for_drafts("r", drafts)
    assert torch.equal(rows[0], masks[0]) and torch.equal(rows[1], masks[1])
    for j in (2, 3, 4):
        assert torch.equal(rows[j], masks[1])
    assert manager.accept("r", tokens) is True


def test_batched_draft_masks_follow_the_row_layout(make_manager, backend, sequence):
    tokens, masks = sequence
    manager = make_manager(backend)
    for rid in ("a", "b"):
        manager.validate_and_compile(rid, constraint(backend))
    manager.accept("b", tokens[:3])
    ids = ["a", "plain", None, "b"]
    drafts = {"a": tokens[:2], "plain": [5, 6, 7], "b": tokens[3:6]}
    rows = manager.fill_bitmask(ids, drafts)
    assert rows.shape[0] == 3 + 4 + 1 + 4
    for j in range(3):
        assert torch.equal(rows[j], masks[j])
    assert bool((rows[3:8] == -1).all())  # an unconstrained request with drafts, then a padding row
    for j in range(4):
        assert torch.equal(rows[8 + j], masks[3 + j])
    assert manager.fill_bitmask(["plain", None]) is None


def target_logits(seed: int, prefix: list[int]) -> torch.Tensor:
    """A deterministic stand-in for a model: the logits depend only on the request and its prefix."""
    key = hash((seed, len(prefix), tuple(prefix[-3:]))) & 0x7FFFFFFF
    return torch.randn(V, generator=torch.Generator().manual_seed(key))


def greedy(manager, seeds: dict[str, int], max_tokens: int, params: dict) -> dict[str, list[int]]:
    for rid in seeds:
        manager.validate_and_compile(rid, params)
    out = {rid: [] for rid in seeds}
    live = list(seeds)
    while live:
        mask = manager.fill_bitmask(live)
        logits = torch.stack([target_logits(seeds[r], out[r]) for r in live])
        for rid, tok in zip(list(live), REFERENCE_OPS.apply_bitmask(logits, mask).argmax(-1).tolist()):
            out[rid].append(tok)
            if manager.accept(rid, [tok]) or len(out[rid]) >= max_tokens:
                live.remove(rid)
    return out


def speculative_greedy(manager, seeds, max_tokens, reference, params, k: int = 3, p_good: float = 0.6):
    """Greedy verification of k drafts per step. Drafts copy the reference output with probability
    ``p_good`` and are random tokens otherwise (mostly invalid for the grammar)."""
    rng = torch.Generator().manual_seed(99)
    for rid in seeds:
        manager.validate_and_compile(rid, params)
    out = {rid: [] for rid in seeds}
    live = list(seeds)
    while live:
        drafts = {}
        for rid in live:
            n, ref = len(out[rid]), reference[rid]
            drafts[rid] = [
                ref[n + j]
                if n + j < len(ref) and torch.rand(1, generator=rng) < p_good
                else int(torch.randint(V, (1,), generator=rng))
                for j in range(k)
            ]
        mask = manager.fill_bitmask(live, drafts)
        row = 0
        for rid in list(live):
            emitted = []
            for j in range(k + 1):
                logits = target_logits(seeds[rid], out[rid] + drafts[rid][:j])[None]
                best = int(REFERENCE_OPS.apply_bitmask(logits, mask[row + j : row + j + 1]).argmax())
                emitted.append(best)
                if j == k or best != drafts[rid][j] or best == EOS:
                    break
            row += k + 1
            emitted = emitted[: max_tokens - len(out[rid])]
            out[rid] += emitted
            if manager.accept(rid, emitted) or len(out[rid]) >= max_tokens:
                live.remove(rid)
    return out


def test_speculative_greedy_equals_non_speculative_greedy(make_manager, backend):
    seeds = {f"r{i}": i for i in range(6)}
    reference = greedy(make_manager(backend), seeds, 48, constraint(backend))
    spec = speculative_greedy(make_manager(backend), seeds, 48, reference, constraint(backend))
    assert spec == reference
    assert sum(t[-1] == EOS for t in reference.values()) >= 4  # most reached the grammar's end
