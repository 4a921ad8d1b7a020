"""Overlap scheduling (``async_scheduling``) is exact: the same tokens, logprobs and finish reasons as the
synchronous loop, token for token, across batching, chunked prefill, preemption under the smallest KV
budget, prefix caching, n > 1, stop strings, min/max tokens, aborts, structured output and speculative
decoding (the last two fall back to synchronous steps). Each test also checks that steps really
overlapped, so it cannot pass by never overlapping."""

from __future__ import annotations

import random

import pytest

from deepinfer_core import SamplingParams
from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.kv.budget import group_block_bytes, min_blocks

from .conftest import make_toy_llm


def _prompts(n: int = 10, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    lens = [1, 2, 15, 16, 17, 63, 64, 65, 80] + [rng.randint(1, 80) for _ in range(max(0, n - 9))]
    return [{"prompt_token_ids": [rng.randrange(2, 96) for _ in range(k)]} for k in lens[:n]]


def _params(n: int, max_tokens: int = 12) -> list[SamplingParams]:
    """Greedy with logprobs, seeded top-p, unseeded top-k, EOS allowed, min_tokens, stop strings, n = 2."""
    kinds = [
        dict(temperature=0.0, logprobs=3, ignore_eos=True),
        dict(temperature=0.8, top_p=0.9, seed=7, logprobs=1),
        dict(temperature=1.0, top_k=20),
        dict(temperature=0.0),
        dict(temperature=0.9, seed=3, min_tokens=5),
        dict(temperature=0.7, seed=5, stop=["b", "7"], include_stop_str_in_output=True),
        dict(temperature=0.9, seed=11, n=2),
        dict(temperature=0.0, prompt_logprobs=2, max_tokens=3),
    ]
    return [SamplingParams(**{"max_tokens": max_tokens, **kinds[i % len(kinds)]}) for i in range(n)]


def _same(a, b, atol: float = 1e-6) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.prompt_logprobs is None or len(x.prompt_logprobs) == len(y.prompt_logprobs)
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert (cx.token_ids, cx.text, cx.finish_reason) == (cy.token_ids, cy.text, cy.finish_reason)
            for px, py in zip(cx.logprobs or (), cy.logprobs or (), strict=True):
                assert px.keys() == py.keys()
                assert all(
                    abs(px[t].logprob - py[t].logprob) <= atol and px[t].rank == py[t].rank for t in px
                )


def _run(prompts, params, **cfg):
    """Outputs, the engine, and how many launches overlapped a step in flight."""
    llm = make_toy_llm(**cfg)
    counts = _count_overlaps(llm.engine)
    outs = llm.generate(prompts, params, use_tqdm=False)
    _no_leaks(llm.engine)
    return outs, llm.engine, counts["overlapped"]


def _count_overlaps(engine) -> dict:
    counts = {"overlapped": 0}
    loop, real = engine.overlap, engine.overlap.launch

    def launch(sched):
        counts["overlapped"] += loop.inflight is not None
        return real(sched)

    loop.launch = launch
    return counts


def _no_leaks(engine) -> None:
    assert engine.overlap.inflight is None and not engine.requests
    for pool in engine.kv.pools.values():
        assert pool.num_in_use == 0
    assert all(s.num_pending == 0 for s in engine.scheduler.running)


def _min_budget(**cfg) -> int:
    e = make_toy_llm(**cfg).engine
    specs, bs = e.model.cache_specs(), e.kv_layout.block_size
    need = min_blocks(specs, bs, e.max_model_len, e.config.max_num_batched_tokens)
    nbytes = group_block_bytes(specs, bs)
    return sum(need[g] * nbytes[g] for g in need)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(max_num_batched_tokens=4096),
        dict(max_num_batched_tokens=24, max_num_seqs=5),  # chunked prefill, prefill mixed with decode
        dict(max_num_batched_tokens=48, enable_prefix_caching=False),
    ],
    ids=["one-batch", "chunked", "no-cache"],
)
def test_overlap_emits_the_tokens_of_the_synchronous_loop(cfg):
    prompts, params = _prompts(), _params(10)
    sync, _, _ = _run(prompts, params, async_scheduling=False, **cfg)
    outs, _, overlapped = _run(prompts, params, async_scheduling=True, **cfg)
    assert overlapped > 5
    _same(sync, outs)


@pytest.mark.parametrize("caching", [False, True])
def test_overlap_under_preemption_at_the_smallest_kv_budget(caching):
    cfg = dict(max_num_batched_tokens=48, enable_prefix_caching=caching)
    cfg["kv_cache_memory_bytes"] = _min_budget(**cfg)
    prompts, params = _prompts(8), _params(8, max_tokens=14)
    sync, _, _ = _run(prompts, params, async_scheduling=False, **cfg)
    outs, engine, overlapped = _run(prompts, params, async_scheduling=True, **cfg)
    assert overlapped > 5 and engine.scheduler.num_preemptions > 0
    _same(sync, outs)


def test_shared_prefixes_hit_the_cache_with_overlap():
    rng = random.Random(4)
    head = [rng.randrange(2, 96) for _ in range(70)]
    prompts = [{"prompt_token_ids": head + [rng.randrange(2, 96) for _ in range(k)]} for k in (1, 5, 30, 64)]
    params = _params(4, max_tokens=20)
    sync, _, _ = _run(prompts, params, async_scheduling=False, max_num_seqs=2)
    outs, engine, overlapped = _run(prompts, params, async_scheduling=True, max_num_seqs=2)
    assert overlapped > 5 and engine.get_stats()["prefix_cache_hits"] > 0
    _same(sync, outs)


def test_a_stopped_request_gets_no_extra_token_and_its_blocks_are_freed():
    """Stop tokens and max_tokens end requests while their next step is already in flight: that token is
    computed, discarded, and its KV accounted and freed."""
    prompts = [{"prompt_token_ids": [5 + i, 9, 11 + i]} for i in range(6)]
    free, _, _ = _run(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    # each request stops at the token its free run emitted at position 2 + i % 3 (or at max_tokens)
    params = [
        SamplingParams(max_tokens=4 + i, temperature=0.0, stop_token_ids=[o.outputs[0].token_ids[2 + i % 3]])
        for i, o in enumerate(free)
    ]
    sync, _, _ = _run(prompts, params, async_scheduling=False)
    outs, engine, overlapped = _run(prompts, params, async_scheduling=True)
    assert overlapped > 3
    assert {o.outputs[0].finish_reason for o in outs} == {"stop"}
    assert all(len(o.outputs[0].token_ids) <= 3 + i % 3 for i, o in enumerate(outs))
    _same(sync, outs)
    assert engine.get_stats()["num_generation_tokens"] == sum(len(o.outputs[0].token_ids) for o in outs)


def _step_and_abort(async_scheduling: bool, after: int):
    llm = make_toy_llm(async_scheduling=async_scheduling)
    e = llm.engine
    sp = SamplingParams(max_tokens=40, temperature=0.8, seed=1, ignore_eos=True)
    ids = [e.add_request(ProcessedPrompt(None, [3 + i, 4, 5], sp)) for i in range(4)]
    outs = {}
    for n in range(200):
        if n == after:
            e.abort(ids[1])
            e.abort(ids[2])
        outs.update((o.request_id, o) for o in e.step())
        if not e.has_unfinished():
            break
    _no_leaks(e)
    return [outs[i] for i in ids]


@pytest.mark.parametrize("after", [1, 2, 7])
def test_an_abort_reports_the_tokens_of_the_synchronous_loop(after):
    sync, outs = _step_and_abort(False, after), _step_and_abort(True, after)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "abort", "abort", "length"]
    _same(sync, outs)


def test_max_model_len_is_never_passed_by_a_pending_token():
    prompts = [{"prompt_token_ids": list(range(2, 2 + k))} for k in (40, 60, 63)]
    params = [SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)] * 3
    sync, _, _ = _run(prompts, params, async_scheduling=False, max_model_len=64)
    outs, _, overlapped = _run(prompts, params, async_scheduling=True, max_model_len=64)
    assert overlapped > 5
    assert [len(p["prompt_token_ids"]) + len(o.outputs[0].token_ids) for p, o in zip(prompts, outs)] == [
        64
    ] * 3
    _same(sync, outs)


def test_penalties_step_synchronously_and_stay_exact():
    """A request with penalties needs its last token on the host: while it is live the engine does not
    overlap; once it finishes, overlap resumes."""
    prompts = _prompts(6)
    params = [SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.3)] + [
        SamplingParams(max_tokens=30, temperature=0.0)
    ] * 5
    sync, _, _ = _run(prompts, params, async_scheduling=False)
    outs, _, overlapped = _run(prompts, params, async_scheduling=True)
    assert overlapped > 5  # after the penalised request finished
    _same(sync, outs)


def test_persistent_batch_tables_equal_tables_rebuilt_every_step():
    """Rows rewritten only when the KV manager changed a sequence's tables (new blocks, released window
    blocks, preemption, prefix-cache hits) still equal tables rebuilt from scratch, at every step."""
    import torch

    cfg = dict(max_num_batched_tokens=48, max_num_seqs=6)
    cfg["kv_cache_memory_bytes"] = _min_budget(**cfg)
    llm = make_toy_llm(async_scheduling=True, **cfg)
    runner, checked = llm.engine.runner, []
    pb, real = runner.batch, runner.batch.block_tables

    def block_tables(rows, num_rows):
        out = real(rows, num_rows)
        seqs = [pb.owner[r] for r in rows]
        for g, t in out.items():
            assert torch.equal(t, runner.block_table(seqs, g, num_rows)), g
        checked.append(len(rows))
        return out

    pb.block_tables = block_tables
    llm.generate(_prompts(8), _params(8, max_tokens=14), use_tqdm=False)
    assert len(checked) > 20 and llm.engine.scheduler.num_preemptions > 0
    assert pb.capacity == 64 and len(pb.row_of) <= 6 + 10  # rows are reused
