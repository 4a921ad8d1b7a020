"""Every refusal has its status and OpenAI's error shape, names what was wrong, and leaves the server
serving."""

from __future__ import annotations

import asyncio
import hmac

import httpx
import openai
import pytest

from deepinfer_core.engine.async_llm import AsyncLLM
from deepinfer_core.serve.settings import ServeSettings

from ..engine.conftest import make_toy_llm
from .conftest import MODEL, running_server

GOOD = {"model": MODEL, "prompt": "abc", "max_tokens": 4, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "abc"}], "max_tokens": 4}


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("/completions", {**GOOD, "temprature": 0.5}, "temprature"),
        ("/chat/completions", {**CHAT, "stream_option": {}}, "stream_option"),
        ("/completions", {**GOOD, "temperature": -1}, "temperature"),
        ("/completions", {**GOOD, "top_p": 1.5}, "top_p"),
        ("/completions", {**GOOD, "n": 0}, "n"),
        ("/completions", {**GOOD, "logprobs": 50}, "logprobs"),
        ("/completions", {**GOOD, "max_tokens": 10_000}, "max_tokens"),
        ("/completions", {**GOOD, "max_tokens": 509}, "max_tokens"),  # beyond max_model_len - 4 prompt tokens
        ("/completions", {**GOOD, "prompt": "a" * 600}, "prompt"),
        ("/completions", {**GOOD, "prompt": []}, "prompt"),
        ("/completions", {**GOOD, "prompt": [1, 10_000]}, "prompt"),
        ("/completions", {**GOOD, "prompt": ["a", 1]}, "prompt"),
        ("/completions", {**GOOD, "stop": 3}, "stop"),
        ("/completions", {**GOOD, "suffix": "x"}, "suffix"),
        ("/completions", {k: v for k, v in GOOD.items() if k != "prompt"}, "prompt"),
        ("/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("/chat/completions", {**CHAT, "reasoning_effort": "extreme"}, "reasoning_effort"),
        ("/chat/completions", {**CHAT, "chat_template_kwargs": {"foo": 1}}, "chat_template_kwargs.foo"),
        ("/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
        ("/chat/completions", {**CHAT, "n": 129, "temperature": 1}, "n"),  # the engine's max_n
    ],
)
def test_a_bad_parameter_is_a_400_that_names_it(toy, route, body, param):
    err = _error(httpx.post(toy.v1 + route, json=body, timeout=60), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_a_body_that_is_not_a_json_object_is_a_400(toy):
    _error(httpx.post(toy.v1 + "/completions", content=b"{not json", timeout=60), 400)
    _error(httpx.post(toy.v1 + "/completions", json=[1, 2], timeout=60), 400)


def test_an_unknown_model_or_route_is_a_404(toy):
    err = _error(httpx.post(toy.v1 + "/completions", json={**GOOD, "model": "gpt-4"}, timeout=60), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    _error(httpx.get(toy.url + "/v1/nothing", timeout=60), 404)
    models = httpx.get(toy.v1 + "/models", timeout=60).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_without_the_api_key_v1_routes_are_a_401(toy):
    with running_server(toy.llm, api_key="s3cret") as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            _error(httpx.post(url + "/v1/completions", json=GOOD, headers=headers, timeout=60), 401)
            _error(httpx.get(url + "/v1/models", headers=headers, timeout=60), 401)
        assert httpx.get(url + "/health", timeout=60).status_code == 200
        assert httpx.get(url + "/metrics", timeout=60).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong").completions.create(**GOOD)
        r = openai.OpenAI(base_url=url + "/v1", api_key="s3cret").completions.create(**GOOD)
        assert r.choices[0].finish_reason == "length"


def test_the_api_key_is_compared_in_constant_time(toy, monkeypatch):
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    with running_server(toy.llm, api_key="s3cret") as url:
        for key, status in (("wrong", 401), ("s3cret", 200)):
            r = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=60)
            assert r.status_code == status
    assert compared == [(b"wrong", b"s3cret"), (b"s3cret", b"s3cret")]


def test_an_oversized_body_is_a_413_with_or_without_its_length(toy):
    with running_server(toy.llm, max_body_bytes=2000) as url:
        big = {**GOOD, "prompt": "a" * 3000}
        _error(httpx.post(url + "/v1/completions", json=big, timeout=60), 413)

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"a" * 500
            yield b'"}'

        _error(httpx.post(url + "/v1/completions", content=chunks(), timeout=60), 413)
        assert httpx.post(url + "/v1/completions", json=GOOD, timeout=60).status_code == 200


def test_a_full_waiting_queue_is_a_503_with_retry_after():
    llm = AsyncLLM(make_toy_llm(max_num_seqs=1).engine)  # the server's setting is the limit
    long = {"prompt": "abc", "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def run(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            async with c.stream("POST", "/v1/completions", json=long) as running:
                lines = running.aiter_lines()  # held: a collected iterator would close the connection
                async for line in lines:
                    if line.startswith("data: "):
                        break  # it is generating: the one running slot is taken
                waiting = asyncio.ensure_future(c.post("/v1/completions", json=GOOD))
                await asyncio.to_thread(llm.wait_for_stats, lambda s: s.num_waiting == 1, 60)
                refused = await c.post("/v1/completions", json=GOOD)
            # the stream is closed: the running request is aborted and the waiting one runs
            done = await waiting
            again = await c.post("/v1/completions", json=GOOD)
        return refused, done, again

    try:
        with running_server(llm, retry_after_s=3, max_waiting_requests=1) as url:
            refused, done, again = asyncio.run(run(url))
    finally:
        llm.shutdown()
    err = _error(refused, 503)
    assert refused.headers["Retry-After"] == "3" and err["type"] == "server_overloaded"
    assert done.status_code == 200 and again.status_code == 200


def test_the_server_keeps_serving_after_errors(toy):
    bad = [{**GOOD, "temperature": -1}, {**GOOD, "nope": 1}, {**GOOD, "model": "x"}]
    for body in bad * 3:
        assert httpx.post(toy.v1 + "/completions", json=body, timeout=60).status_code in (400, 404)
    want = toy.offline.generate(["abc"], _sp(), use_tqdm=False)[0].outputs[0].text
    assert httpx.post(toy.v1 + "/completions", json=GOOD, timeout=60).json()["choices"][0]["text"] == want
    assert httpx.get(toy.url + "/health", timeout=60).json() == {"status": "ok"}


def _sp():
    from deepinfer_core import SamplingParams

    return SamplingParams(max_tokens=4, temperature=0)


def test_once_the_engine_has_stopped_health_and_requests_are_503():
    llm = AsyncLLM(make_toy_llm().engine)
    with running_server(llm) as url:
        assert httpx.get(url + "/health", timeout=60).json() == {"status": "ok"}
        llm.shutdown()
        assert httpx.get(url + "/health", timeout=60).status_code == 503
        for route, body in (("/v1/completions", GOOD), ("/v1/chat/completions", CHAT)):
            err = _error(httpx.post(url + route, json=body, timeout=60), 503)
            assert "not running" in err["message"] and err["type"] == "server_error"
        metrics = httpx.get(url + "/metrics", timeout=60).text
    assert 'deepinfer_requests_total{outcome="error"} 2.0' in metrics


def test_settings_defaults_are_the_safe_ones():
    s = ServeSettings()
    assert s.host == "127.0.0.1" and s.api_key is None and s.cors_allow_origins == []
    assert s.max_body_bytes > 0 and s.max_tokens_limit > 0 and s.max_waiting_requests is not None


def test_cors_headers_only_when_origins_are_configured(toy):
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    r = httpx.options(toy.v1 + "/completions", headers=pre, timeout=60)
    assert "access-control-allow-origin" not in r.headers
    with running_server(toy.llm, cors_allow_origins=["https://app.example"]) as url:
        r = httpx.options(url + "/v1/completions", headers=pre, timeout=60)
        assert r.headers["access-control-allow-origin"] == "https://app.example"
