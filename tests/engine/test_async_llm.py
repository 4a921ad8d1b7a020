"""AsyncLLM: one step thread owns the engine; each request streams exactly what LLM.generate returns."""

from __future__ import annotations

import asyncio
import random

import pytest

from deepinfer_core import SamplingParams
from deepinfer_core.engine.async_llm import (
    AsyncLLM,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
)
from deepinfer_core.engine.llm_engine import LLMEngine

from .conftest import make_toy_llm, toy_backends
from .toy_model import ToyHybridLM, ToyTokenizer

TIMEOUT = 60


@pytest.fixture(scope="module")
def pair():
    """(AsyncLLM over a toy engine, offline LLM over an identical one)."""
    llm = AsyncLLM(make_toy_llm().engine)
    yield llm, make_toy_llm()
    llm.shutdown()


async def _drain(stream) -> tuple[dict[int, str], dict[int, list[int]], dict[int, list], object]:
    texts: dict[int, str] = {}
    tokens: dict[int, list[int]] = {}
    lps: dict[int, list] = {}
    last = None
    async for d in stream:
        for c in d.outputs:
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens.setdefault(c.index, []).extend(c.token_ids)
            lps.setdefault(c.index, []).extend(c.logprobs or [])
        last = d
    assert last.finished
    return texts, tokens, lps, last.output


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=20),
        SamplingParams(temperature=0, max_tokens=30, stop=["ddd", "xyz"], logprobs=2),
        SamplingParams(
            temperature=0.9, seed=3, n=3, max_tokens=12, stop=["q"], include_stop_str_in_output=True
        ),
        SamplingParams(temperature=1.0, seed=5, max_tokens=16, prompt_logprobs=1, stop_token_ids=[7, 9]),
    ]


def test_streams_add_up_to_the_offline_outputs(pair):
    llm, offline = pair
    prompts = ["abcabc", "hello", "zzyzx", "pqrs"]
    params = _params()
    want = offline.generate(prompts, params, use_tqdm=False)

    async def run():
        streams = [await llm.generate(p, sp) for p, sp in zip(prompts, params)]
        return await asyncio.gather(*[_drain(s) for s in streams])

    for (texts, tokens, lps, final), ref in zip(asyncio.run(run()), want):
        for c in ref.outputs:
            assert texts[c.index] == c.text
            assert tokens[c.index] == c.token_ids
            assert (lps[c.index] or None) == c.logprobs
        assert final.prompt_logprobs == ref.prompt_logprobs
        assert [c.text for c in final.outputs] == [c.text for c in ref.outputs]


def test_every_streamed_prefix_is_a_prefix_of_the_final_text(pair):
    """Stop strings are cut from the final text; nothing past the cut is ever streamed."""
    llm, _ = pair
    rng = random.Random(0)

    async def run():
        for _ in range(12):
            prompt = "".join(rng.choice("abcxyz") for _ in range(rng.randrange(1, 8)))
            stop = ["".join(rng.choice("abcdexyz") for _ in range(rng.randrange(1, 4))) for _ in range(2)]
            s = await llm.generate(
                prompt, SamplingParams(temperature=0.7, seed=rng.randrange(99), max_tokens=40, stop=stop)
            )
            streamed = ""
            async for d in s:
                streamed += d.outputs[0].text if d.outputs else ""
                if d.finished:
                    assert streamed == d.output.outputs[0].text
                else:
                    assert all(x not in streamed for x in stop)

    asyncio.run(run())


def test_abort_frees_blocks_before_the_next_step(pair):
    llm, _ = pair

    async def run():
        s = await llm.generate("abc", SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        first = await s.__anext__()
        assert first.outputs and not first.finished
        s.abort()
        return await asyncio.to_thread(llm.wait_for_stats, lambda st: st.num_running == 0, TIMEOUT)

    stats = asyncio.run(run())
    assert sum(stats.kv_blocks_in_use.values()) == 0
    assert not llm.engine.requests


def test_a_full_waiting_queue_refuses_new_requests():
    llm = AsyncLLM(make_toy_llm(max_num_seqs=1).engine, max_waiting_requests=1)

    async def run():
        running = await llm.generate("abc", SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        await running.__anext__()  # scheduled: no longer waiting
        queued = await llm.generate("abd", SamplingParams(temperature=0, max_tokens=4))
        await asyncio.to_thread(llm.wait_for_stats, lambda st: st.num_waiting == 1, TIMEOUT)
        with pytest.raises(QueueFullError):
            await llm.generate("abe", SamplingParams(temperature=0, max_tokens=4))
        running.abort()
        out = await queued.result()
        assert out.outputs[0].finish_reason == "length"
        third = await llm.generate("abe", SamplingParams(temperature=0, max_tokens=4))
        return await third.result()

    try:
        assert len(asyncio.run(run()).outputs[0].token_ids) == 4
    finally:
        llm.shutdown()


def test_a_submission_the_engine_refuses_fails_alone_and_all_of_it(pair):
    """Validation passed, but the engine refuses to queue it (an id already running): the whole
    submission fails, nothing of it is left queued, and the request already running goes on."""
    llm, offline = pair
    sp = SamplingParams(temperature=0, max_tokens=8)

    async def run():
        [a, b, c] = await llm.process(["abc", "abd", "abe"], sp)
        [first] = llm.submit([a], ["same-id"])
        dup = llm.submit([b, c], ["other-id", "same-id"])
        for s in dup:
            with pytest.raises(ValueError, match="same-id"):
                await s.result()
        return await first.result()

    out = asyncio.run(run())
    assert out.outputs[0].token_ids == offline.generate(["abc"], sp, use_tqdm=False)[0].outputs[0].token_ids
    assert llm.wait_for_stats(lambda st: st.num_running == 0, TIMEOUT).num_waiting == 0
    assert "other-id" not in llm.engine.requests


class _PoisonToy(ToyHybridLM):
    def forward(self, batch, kv):
        if bool((batch.input_ids == 50).any()):
            raise RuntimeError("poisoned")
        return super().forward(batch, kv)


def _poisoned_llm() -> AsyncLLM:
    from deepinfer_core.config import load_config

    cfg = load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=512)
    return AsyncLLM(LLMEngine(cfg, _PoisonToy(), toy_backends(), ToyTokenizer()))


async def _bad_and_good(llm: AsyncLLM):
    """A poisoned and a clean request, queued together so that they share their first step."""
    sp = SamplingParams(temperature=0, max_tokens=4)
    items = await llm.process([{"prompt_token_ids": [3, 50, 4]}, {"prompt_token_ids": [3, 5, 4]}], sp)
    bad, good = llm.submit(items)
    with pytest.raises(RequestFailedError, match="poisoned"):
        await bad.result()
    try:
        return await good.result()
    finally:
        stats = await asyncio.to_thread(llm.wait_for_stats, lambda st: st.num_running == 0, TIMEOUT)
        assert sum(stats.kv_blocks_in_use.values()) == 0


def test_a_request_that_breaks_the_step_fails_alone(pair):
    llm = _poisoned_llm()
    try:
        out = asyncio.run(_bad_and_good(llm))
    finally:
        llm.shutdown()
    ref = pair[1].generate(
        [{"prompt_token_ids": [3, 5, 4]}], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False
    )
    assert out.outputs[0].token_ids == ref[0].outputs[0].token_ids


def test_a_step_that_raises_fails_the_requests_in_flight_and_the_loop_goes_on():
    """Without the engine's per-request retry (``isolate_failures=False``, as under expert parallelism) a
    failing step raises: every request in it fails, none is left in the engine, new ones are served."""
    llm = _poisoned_llm()
    llm.engine.isolate_failures = False

    async def run():
        with pytest.raises(RequestFailedError, match="poisoned"):
            await _bad_and_good(llm)
        good = await llm.generate(
            {"prompt_token_ids": [3, 5, 4]}, SamplingParams(temperature=0, max_tokens=4)
        )
        return await good.result()

    try:
        assert len(asyncio.run(run()).outputs[0].token_ids) == 4
        assert not llm.engine.scheduler.running and not llm.engine.scheduler.waiting
    finally:
        llm.shutdown()


def test_shutdown_fails_pending_requests_and_refuses_new_ones():
    llm = AsyncLLM(make_toy_llm().engine)

    async def run():
        s = await llm.generate("abc", SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        await s.__anext__()
        await asyncio.to_thread(llm.shutdown)
        with pytest.raises(EngineDeadError):
            async for _ in s:
                pass
        with pytest.raises(EngineDeadError):
            await llm.generate("abc")

    asyncio.run(run())
    assert not llm.is_alive


def test_requests_from_two_event_loops_each_get_their_own_outputs(pair):
    llm, offline = pair
    sp = SamplingParams(temperature=0, max_tokens=10)

    async def one(prompt):
        return await (await llm.generate(prompt, sp)).result()

    a = asyncio.run(one("abc"))
    b = asyncio.run(one("xyz"))
    want = offline.generate(["abc", "xyz"], sp, use_tqdm=False)
    assert [a.outputs[0].text, b.outputs[0].text] == [w.outputs[0].text for w in want]


def test_invalid_parameters_are_raised_to_the_caller_before_queuing(pair):
    llm, _ = pair

    async def run():
        with pytest.raises(ValueError, match="max_tokens"):
            await llm.generate("abc", SamplingParams(max_tokens=10_000))

    asyncio.run(run())
    assert llm.stats().num_waiting == 0
