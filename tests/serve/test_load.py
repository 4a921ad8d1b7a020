"""Load and faults: many concurrent streams each get exactly their own tokens; clients that vanish free
their KV blocks; a request that breaks the engine's step fails without taking the server down."""

from __future__ import annotations

import asyncio
import random

import httpx
import openai
import pytest

from deepinfer_core import SamplingParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.async_llm import AsyncLLM
from deepinfer_core.engine.llm_engine import LLMEngine

from ..engine.conftest import toy_backends
from ..engine.toy_model import ToyHybridLM, ToyTokenizer
from .conftest import MODEL, running_server
from .scripted_model import PoisonLM
from .sse import events

TIMEOUT = 120


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 96) for _ in range(rng.randrange(3, 13))] for _ in range(n)]


def _idle(stats) -> bool:
    return stats.num_running == 0 and stats.num_waiting == 0 and not any(stats.kv_blocks_in_use.values())


def test_500_concurrent_streams_each_get_exactly_their_own_tokens(toy):
    prompts = _prompts(500, seed=1)
    want = toy.offline.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=8),
        use_tqdm=False,
    )

    async def one(client: openai.AsyncOpenAI, prompt: list[int]) -> tuple[list[int], str, list[str]]:
        stream = await client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True},
        )
        tokens, text, finishes = [], "", []
        async for ch in stream:
            for c in ch.choices:
                tokens += c.model_extra.get("token_ids") or []
                text += c.text
                if c.finish_reason:
                    finishes.append(c.finish_reason)
        return tokens, text, finishes

    async def run():
        client = openai.AsyncOpenAI(base_url=toy.v1, api_key="unused", max_retries=0, timeout=TIMEOUT)
        try:
            return await asyncio.gather(*[one(client, p) for p in prompts])
        finally:
            await client.close()

    results = asyncio.run(run())
    assert len(results) == 500
    for (tokens, text, finishes), ref in zip(results, want):
        assert tokens == ref.outputs[0].token_ids
        assert text == ref.outputs[0].text
        assert finishes == [ref.outputs[0].finish_reason]
    assert _idle(toy.llm.wait_for_stats(_idle, TIMEOUT))


def test_100_clients_that_disconnect_mid_stream_leave_no_blocks_and_the_server_goes_on(toy):
    prompts = _prompts(100, seed=2)
    body = {"max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}

    async def leave_early(client: httpx.AsyncClient, prompt: list[int]) -> None:
        async with client.stream("POST", "/v1/completions", json={**body, "prompt": prompt}) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            async for line in lines:
                if line.startswith("data: ") and '"text":"' in line:
                    break  # got tokens: now hang up mid-stream
        await lines.aclose()

    async def run(url: str):
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT, limits=limits) as c:
            await asyncio.gather(*[leave_early(c, p) for p in prompts])

    with running_server(toy.llm) as url:
        asyncio.run(run(url))
        stats = toy.llm.wait_for_stats(_idle, TIMEOUT)
        metrics = httpx.get(url + "/metrics", timeout=TIMEOUT).text
        ok = httpx.post(
            url + "/v1/completions",
            json={"prompt": "abc", "max_tokens": 5, "temperature": 0},
            timeout=TIMEOUT,
        )
    assert _idle(stats) and stats.num_grammars == 0
    assert not toy.llm.engine.requests
    aborted = _counter(metrics, 'deepinfer_requests_total{outcome="abort"}')
    finished = _counter(metrics, 'deepinfer_requests_total{outcome="length"}')
    assert aborted + finished == 100 and aborted > 0
    want = toy.offline.generate(["abc"], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert ok.json()["choices"][0]["text"] == want.outputs[0].text


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def poisoned():
    """A server whose model raises inside the engine step when token 50 is in the batch."""
    cfg = load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=512)
    llm = AsyncLLM(LLMEngine(cfg, PoisonLM(ToyHybridLM(), poison=50), toy_backends(), ToyTokenizer()))
    try:
        with running_server(llm) as url:
            yield llm, url
    finally:
        llm.shutdown()


def test_a_request_that_breaks_the_engine_step_fails_alone_and_the_server_goes_on(poisoned, toy):
    llm, url = poisoned
    bad = {"prompt": [3, 50, 4], "max_tokens": 4, "temperature": 0}
    good = [[3, 5, 4], [7, 8, 9, 10]]
    want = toy.offline.generate(
        [{"prompt_token_ids": p} for p in good], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False
    )

    async def run():  # the bad request shares its steps with the good ones
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as c:
            goods = [
                c.post("/v1/completions", json={"prompt": p, "max_tokens": 6, "temperature": 0}) for p in good
            ]
            return await asyncio.gather(c.post("/v1/completions", json=bad), *goods)

    r_bad, *r_good = asyncio.run(run())
    assert r_bad.status_code == 500 and r_bad.json()["error"]["type"] == "server_error"
    assert "poisoned" in r_bad.json()["error"]["message"]
    assert [r.json()["choices"][0]["text"] for r in r_good] == [w.outputs[0].text for w in want]
    with (
        httpx.Client(timeout=TIMEOUT) as c,
        c.stream("POST", url + "/v1/completions", json={**bad, "stream": True}) as s,
    ):
        assert [e["error"]["type"] for e in events(s)] == ["server_error"]
    assert _idle(llm.wait_for_stats(_idle, TIMEOUT))


def test_a_request_whose_grammar_fails_inside_the_engine_fails_alone(scripted):
    """llguidance's ``[^\\s\\S]`` compiles but allows no token, so the engine fails on that request's
    first sample. Both requests are queued together, so they share that step."""
    from deepinfer_core import StructuredOutputsParams
    from deepinfer_core.engine.async_llm import RequestFailedError

    bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="[^\\s\\S]"))
    good = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    async def run():
        items = await scripted.llm.process(["x", "y"], [bad, good])
        s_bad, s_good = scripted.llm.submit(items)
        with pytest.raises(RequestFailedError):
            await s_bad.result()
        return await s_good.result()

    assert len(asyncio.run(run()).outputs[0].token_ids) == 6


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_frees_its_blocks_and_grammar_state_at_once(scripted, stream):
    """A constrained request (a live grammar state) whose client hangs up, mid-stream or while waiting
    for a whole response: the engine drops it long before its max_tokens, and frees everything."""
    body = {
        "prompt": "x",
        "max_tokens": 3000,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
        "structured_outputs": {"regex": "(ab)+"},
    }

    def generating(s) -> bool:
        return s.num_running == 1 and s.num_grammars == 1 and any(s.kv_blocks_in_use.values())

    async def leave(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as c:
            if stream:
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    lines = r.aiter_lines()
                    async for line in lines:
                        if line.startswith("data: "):
                            break
                    assert '"error"' not in line, f"the request failed instead of generating: {line}"
                    await asyncio.to_thread(scripted.llm.wait_for_stats, generating, TIMEOUT)
                await lines.aclose()
            else:
                post = asyncio.ensure_future(c.post("/v1/completions", json=body))
                await asyncio.to_thread(scripted.llm.wait_for_stats, generating, TIMEOUT)
                post.cancel()  # the connection is dropped mid-request
                with pytest.raises(asyncio.CancelledError):
                    await post

    # 5 ms a step: the 3,000 tokens take 15 s or more, however fast the machine, so the request is still
    # generating when the test looks and when its client leaves (a loaded CI machine once let it finish first)
    scripted.model.step_delay_s = 0.005
    try:
        with running_server(scripted.llm) as url:
            asyncio.run(leave(url))
            stats = scripted.llm.wait_for_stats(_idle, TIMEOUT)
            metrics = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    finally:
        scripted.model.step_delay_s = 0.0
    assert stats.num_grammars == 0 and not scripted.llm.engine.requests
    assert _counter(metrics, 'deepinfer_requests_total{outcome="abort"}') == 1
    assert _counter(metrics, 'deepinfer_requests_total{outcome="length"}') == 0
