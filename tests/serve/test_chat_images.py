"""Images through ``/v1/chat/completions`` with the real ``openai`` client, on the tiny V4.1 checkpoint with a
vision tower: ``image_url`` data-URL parts give what the offline ``LLM.chat`` gives for the same messages;
a remote URL, a corrupt image and image parts for a checkpoint that takes none (the demo, V4's encoding)
are 400 errors naming the problem."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import openai
import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.engine.async_llm import AsyncLLM
from deepinfer_core.engine.llm_engine import LLMEngine
from tests.models.deepseek_v41.vl_goldens import CHECKPOINT, image

from .conftest import MODEL, Served, _serve, load_config

SETTINGS = dict(model=str(CHECKPOINT), dtype="float32", kv_cache_dtype="unquantized", block_size=8)


@pytest.fixture(scope="module")
def vision() -> Iterator[Served]:
    engine = LLMEngine.from_config(load_config(environ={}, **SETTINGS))
    offline = LLM.from_engine(LLMEngine.from_config(load_config(environ={}, **SETTINGS)))
    with _serve(AsyncLLM(engine), offline) as s:
        yield s


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _png(name: str) -> bytes:
    buf = io.BytesIO()
    image(name).save(buf, format="PNG")
    return buf.getvalue()


def _messages(url: str) -> list[dict]:
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": parts}]


def test_image_url_parts_give_the_offline_chat_result(vision):
    messages = _messages(_url(_png("b")))
    client = openai.OpenAI(base_url=vision.v1, api_key="x")
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0.0, logprobs=True
    )
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=0)
    offline = vision.offline.chat(messages, params, use_tqdm=False)[0]
    got = [t.logprob for t in resp.choices[0].logprobs.content]
    want = [lp[t].logprob for lp, t in zip(offline.outputs[0].logprobs, offline.outputs[0].token_ids)]
    assert got == pytest.approx(want, abs=1e-5)
    assert resp.usage.prompt_tokens == len(offline.prompt_token_ids) > 14  # the span of image "b" is 14


@pytest.mark.parametrize(
    "url, error",
    [
        ("https://example.com/cat.png", "remote image URLs are not fetched"),
        (_url(b"\x89PNG\r\n\x1a\n broken"), "corrupt image data"),
    ],
)
def test_bad_image_urls_are_400_errors_naming_the_problem(vision, url, error):
    client = openai.OpenAI(base_url=vision.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=error):
        client.chat.completions.create(model=MODEL, messages=_messages(url), max_tokens=2)


def test_image_parts_on_a_v4_checkpoint_are_a_400_error(demo):
    client = openai.OpenAI(base_url=demo.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="images need a DeepSeek-V4.1 checkpoint"):
        client.chat.completions.create(model=MODEL, messages=_messages(_url(_png("a"))), max_tokens=2)
