"""/v1/chat/completions on the demo checkpoint: the chat encoding, parity with LLM.chat, logprobs,
and response_format through the structured-output plugin."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

from deepinfer_core import SamplingParams, StructuredOutputsParams

from .conftest import MODEL, running_server
from .sse import post_stream

MESSAGES = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "def parse(text):"},
]

SCHEMAS = [  # bounded, so a model that follows them must finish
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "kind": {"enum": ["a", "b", "c"]},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
        },
        "required": ["kind", "ok", "tags"],
        "additionalProperties": False,
    },
]


@pytest.fixture(scope="module")
def client(demo):
    return openai.OpenAI(base_url=demo.v1, api_key="unused")


def test_greedy_chat_equals_llm_chat_streamed_and_not(demo, client):
    sp = SamplingParams(temperature=0, max_tokens=24, skip_special_tokens=False, logprobs=2)
    ref = demo.offline.chat(MESSAGES, sp, use_tqdm=False)[0].outputs[0]
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, logprobs=True, top_logprobs=2
    )
    msg = r.choices[0].message
    assert msg.content == ref.text and msg.role == "assistant" and not msg.tool_calls
    assert r.choices[0].finish_reason == ref.finish_reason
    lps = r.choices[0].logprobs.content
    assert [x.logprob for x in lps] == [ref.logprobs[i][t].logprob for i, t in enumerate(ref.token_ids)]
    assert all(
        len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob for x in lps
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        stream=True,
        logprobs=True,
        top_logprobs=2,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason
    streamed = [x for ch in chunks if ch.choices[0].logprobs for x in ch.choices[0].logprobs.content]
    assert [(x.token, x.logprob) for x in streamed] == [(x.token, x.logprob) for x in lps]


def test_n_samples_with_a_seed_equal_offline(demo):
    sp = SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=12, skip_special_tokens=False)
    ref = demo.offline.chat(MESSAGES, sp, use_tqdm=False)[0]
    body = {"messages": MESSAGES, "n": 2, "temperature": 1.0, "seed": 4, "max_completion_tokens": 12}
    r = httpx.post(demo.v1 + "/chat/completions", json=body, timeout=120).json()
    assert [c["message"]["content"] for c in r["choices"]] == [c.text for c in ref.outputs]
    streamed: dict[int, str] = {}
    for ch in post_stream(demo.v1 + "/chat/completions", {**body, "stream": True}):
        for c in ch["choices"]:
            streamed[c["index"]] = streamed.get(c["index"], "") + c["delta"].get("content", "")
    assert streamed == {c.index: c.text for c in ref.outputs}


@pytest.fixture(scope="module")
def compact(demo):
    """A second server on the same engine, writing response_format JSON without whitespace."""
    with running_server(demo.llm, disable_any_whitespace=True) as url:
        yield url + "/v1"


@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "array", "enums"])
def test_json_schema_response_format_always_gives_valid_json(compact, schema):
    """Greedy and two seeded samples, each streamed and not; the six run at once (one batch)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    samples = ({"temperature": 0}, {"temperature": 1.0, "seed": 1}, {"temperature": 1.0, "seed": 2})

    async def one(client: openai.AsyncOpenAI, kw: dict, stream: bool) -> tuple[str, str | None]:
        r = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=96, response_format=fmt, stream=stream, **kw
        )
        if not stream:
            return r.choices[0].message.content, r.choices[0].finish_reason
        chunks = [ch async for ch in r]
        return "".join(ch.choices[0].delta.content or "" for ch in chunks), chunks[-1].choices[
            0
        ].finish_reason

    async def run():
        async with openai.AsyncOpenAI(base_url=compact, api_key="unused") as client:
            return await asyncio.gather(*[one(client, kw, s) for kw in samples for s in (False, True)])

    results = asyncio.run(run())
    for plain, streamed in zip(results[::2], results[1::2]):
        text, finish = plain
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)
        assert streamed == plain


def test_json_object_response_format_gives_what_offline_gives_and_objects_when_it_stops(demo, compact):
    """json_object has no size bound: a sample may hit max_tokens (a valid prefix then); every one that
    stops is a JSON object. (Eight seeds at once, online and offline: on the demo checkpoint some stop and some
    reach max_tokens.)"""
    so = StructuredOutputsParams(json_object=True, disable_any_whitespace=True)
    seeds = range(8)
    sps = [
        SamplingParams(
            temperature=0.8, seed=seed, max_tokens=48, skip_special_tokens=False, structured_outputs=so
        )
        for seed in seeds
    ]
    refs = [o.outputs[0] for o in demo.offline.chat([MESSAGES] * len(sps), sps, use_tqdm=False)]

    async def run():
        async with openai.AsyncOpenAI(base_url=compact, api_key="unused") as client:
            return await asyncio.gather(
                *[
                    client.chat.completions.create(
                        model=MODEL,
                        messages=MESSAGES,
                        max_tokens=48,
                        temperature=0.8,
                        seed=seed,
                        response_format={"type": "json_object"},
                    )
                    for seed in seeds
                ]
            )

    for r, ref in zip(asyncio.run(run()), refs):
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == (ref.text, ref.finish_reason)
    stopped = [ref.text for ref in refs if ref.finish_reason == "stop"]
    assert stopped and all(isinstance(json.loads(t), dict) for t in stopped)
    assert len(stopped) < len(refs)  # the other outcome is exercised too


def test_a_schema_the_grammar_backend_refuses_is_a_400(demo):
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}},
    }
    r = httpx.post(
        demo.v1 + "/chat/completions", json={"messages": MESSAGES, "response_format": fmt}, timeout=60
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format"
