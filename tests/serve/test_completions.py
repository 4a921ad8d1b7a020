"""/v1/completions on the demo checkpoint: what the server returns is what LLM.generate returns."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from deepinfer_core import SamplingParams

from .conftest import MODEL
from .sse import completion_texts, post_stream

PROMPTS = ["def quicksort(xs):", "import os\n\nclass Path"]


@pytest.fixture(scope="module")
def client(demo):
    return openai.OpenAI(base_url=demo.v1, api_key="unused")


def test_greedy_text_equals_offline_streamed_and_not(demo, client):
    want = demo.offline.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    for prompt, ref in zip(PROMPTS, want):
        plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
        assert plain.choices[0].text == ref.outputs[0].text
        assert plain.choices[0].finish_reason == ref.outputs[0].finish_reason
        assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (len(ref.prompt_token_ids), 16)
        stream = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True
        )
        assert "".join(ch.choices[0].text for ch in stream) == ref.outputs[0].text


def test_async_client_stream_carries_token_ids_and_usage(demo):
    ref = demo.offline.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]

    async def run():
        client = openai.AsyncOpenAI(base_url=demo.v1, api_key="unused")
        stream = await client.completions.create(
            model=MODEL,
            prompt=PROMPTS[0],
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
        chunks = [ch async for ch in stream]
        await client.close()
        return chunks

    chunks = asyncio.run(run())
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert sum((ch.choices[0].model_extra["token_ids"] for ch in chunks[:-1]), []) == ref.outputs[0].token_ids
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == ref.outputs[0].text


def test_n_seed_stop_logprobs_and_echo_behave_as_offline(demo):
    sp = SamplingParams(
        n=3, temperature=0.9, seed=11, max_tokens=20, stop=["\n\n", ")"], logprobs=2, prompt_logprobs=2
    )
    ref = demo.offline.generate([PROMPTS[0]], sp, use_tqdm=False)[0]
    body = {
        "model": MODEL,
        "prompt": PROMPTS[0],
        "n": 3,
        "temperature": 0.9,
        "seed": 11,
        "max_tokens": 20,
        "stop": ["\n\n", ")"],
        "logprobs": 2,
        "echo": True,
    }
    plain = httpx.post(demo.v1 + "/completions", json=body, timeout=120).json()
    chunks = post_stream(demo.v1 + "/completions", {**body, "stream": True})
    streamed = completion_texts(chunks)
    prompt_tokens = [
        ref.prompt_logprobs[i + 1][t].decoded_token for i, t in enumerate(ref.prompt_token_ids[1:])
    ]
    for c in ref.outputs:
        got = plain["choices"][c.index]
        assert got["text"] == PROMPTS[0] + c.text == streamed[c.index]
        assert got["finish_reason"] == c.finish_reason and got.get("stop_reason") == c.stop_reason
        lp = got["logprobs"]
        gen = [c.logprobs[i][t] for i, t in enumerate(c.token_ids)]
        assert lp["tokens"][len(ref.prompt_token_ids) :] == [x.decoded_token for x in gen]
        assert lp["tokens"][1 : len(ref.prompt_token_ids)] == prompt_tokens
        assert lp["token_logprobs"][len(ref.prompt_token_ids) :] == [x.logprob for x in gen]
        assert lp["token_logprobs"][0] is None
        assert all(len(top) <= 3 for top in lp["top_logprobs"][1:])
        assert lp["text_offset"] == sorted(lp["text_offset"])
    assert len({c["text"] for c in plain["choices"]}) > 1, "three samples with one seed should differ"
    assert any(c.stop_reason in ("\n\n", ")") for c in ref.outputs), "no sample hit a stop string"
    again = httpx.post(demo.v1 + "/completions", json=body, timeout=120).json()
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in plain["choices"]]


def test_prompt_lists_and_token_ids_give_one_choice_per_prompt_and_sample(demo, client):
    tok = demo.offline.get_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS]
    want = demo.offline.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    texts = [w.outputs[0].text for w in want]
    for prompt in (PROMPTS, ids):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        assert [c.index for c in r.choices] == [0, 1]
        assert [c.text for c in r.choices] == texts
    r = client.completions.create(model=MODEL, prompt=ids[1], max_tokens=8, temperature=0, echo=True)
    assert r.choices[0].text == tok.decode(ids[1], skip_special_tokens=False) + texts[1]
    chunks = post_stream(
        demo.v1 + "/completions", {"prompt": PROMPTS, "max_tokens": 8, "temperature": 0, "stream": True}
    )
    assert completion_texts(chunks) == {0: texts[0], 1: texts[1]}


def test_extra_engine_sampling_fields_are_accepted(demo, client):
    extra = {
        "top_k": 5,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "ignore_eos": True,
        "min_tokens": 4,
        "stop_token_ids": [11],
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
    }
    sp = SamplingParams(temperature=0.7, seed=2, max_tokens=10, **extra)
    ref = demo.offline.generate([PROMPTS[1]], sp, use_tqdm=False)[0].outputs[0]
    r = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=0.7, seed=2, extra_body=extra
    )
    assert r.choices[0].text == ref.text


def test_penalties_top_p_and_logit_bias_behave_as_offline(demo):
    """OpenAI's own sampling fields reach the engine as LLM.generate's SamplingParams; each changes
    what this seeded sample gives, so a field the server dropped would show. (The requests run
    concurrently, as do the offline ones: one batch each.) The seed is the first for which every field changes
    the offline sample (a penalty cannot change every sample: only one whose draws it moves)."""
    fields = dict(top_p=0.8, presence_penalty=1.5, frequency_penalty=1.0, logit_bias={"29": 4.0})
    wire = [{}, *({k: v} for k, v in fields.items())]
    engine = [{"logit_bias": {29: 4.0}} if "logit_bias" in w else w for w in wire]
    for seed in range(4, 64):
        base = dict(temperature=0.8, seed=seed, max_tokens=16)
        want = demo.offline.generate(
            [PROMPTS[1]] * len(wire), [SamplingParams(**base, **e) for e in engine], use_tqdm=False
        )
        if all(w.outputs[0].text != want[0].outputs[0].text for w in want[1:]):
            break

    async def run():
        async with openai.AsyncOpenAI(base_url=demo.v1, api_key="unused") as client:
            rs = await asyncio.gather(
                *[client.completions.create(model=MODEL, prompt=PROMPTS[1], **base, **w) for w in wire]
            )
        return [r.choices[0].text for r in rs]

    texts = asyncio.run(run())
    assert texts == [w.outputs[0].text for w in want]
    unchanged = [name for name, text in zip(fields, texts[1:]) if text == texts[0]]
    assert not unchanged, f"{unchanged} left the seeded sample unchanged"
