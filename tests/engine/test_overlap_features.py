"""Overlap scheduling with the features that need the host: structured output and speculative decoding
step synchronously while they are live (and overlap resumes after them), and on the tiny DeepSeek-V4
checkpoint static decode steps (padded, replayed through a graph stand-in) take their pending tokens from
the device buffer; every output equals the synchronous loop's."""

from __future__ import annotations

import random

import pytest

from deepinfer_core import LLM, SamplingParams, StructuredOutputsParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.llm_engine import LLMEngine
from tests.graph_standin import stand_in_capture

from ..models.deepseek_v4.test_mtp import MTPReference
from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf, save_deepseek
from .conftest import toy_backends, v4_tokenizer_and_grammars
from .test_overlap_scheduling import _count_overlaps, _no_leaks, _same
from .test_spec_decode_ngram import PROPOSERS, ngram
from .toy_model import ToyHybridLM, ToyTokenizer

VOCAB = 320


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    hf = build_hf(Schedule("engine", (CSA, HCA)), seed=0)
    return str(save_deepseek(hf, tmp_path_factory.mktemp("v4mtp"), extra=MTPReference(hf).deepseek_tensors()))


def _v4_prompts() -> list[dict]:
    rng = random.Random(3)
    return [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in (1, 9, 16, 33)]


V4_PARAMS = [
    SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=1),
    SamplingParams(max_tokens=14, temperature=0.9, seed=2, ignore_eos=True),
    SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=4, ignore_eos=True),
]


@pytest.fixture(scope="module")
def v4_sync(ckpt):
    llm = LLM(ckpt, kv_cache_memory_bytes=64 << 20, max_model_len=256, async_scheduling=False)
    return llm.generate(_v4_prompts(), V4_PARAMS, use_tqdm=False)


@pytest.mark.parametrize("device_plan", [False, True], ids=["host_plan", "device_plan"])
@pytest.mark.parametrize("capture", [False, True], ids=["static", "replayed"])
def test_static_decode_steps_read_pending_tokens_from_the_device(
    ckpt, v4_sync, monkeypatch, capture, device_plan
):
    llm = LLM(
        ckpt,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        async_scheduling=True,
        device_plan=device_plan,
    )
    runner = llm.engine.runner
    counts = stand_in_capture(runner, monkeypatch) if capture else None
    runner.static_decode(8, capture=capture)
    overlaps = _count_overlaps(llm.engine)
    pending_static = []
    real = runner._fill_pending

    def fill(batch, flat_rows, rows):
        if batch.graph_key is not None and flat_rows:
            pending_static.append(len(flat_rows))
        return real(batch, flat_rows, rows)

    monkeypatch.setattr(runner, "_fill_pending", fill)
    _same(v4_sync, llm.generate(_v4_prompts(), V4_PARAMS, use_tqdm=False), atol=1e-5)
    assert overlaps["overlapped"] > 5 and len(pending_static) > 5
    if capture:
        assert counts["captures"] == len(runner.graphs) > 0 and counts["replays"] > counts["captures"]
    _no_leaks(llm.engine)


def test_mtp_with_async_scheduling_steps_synchronously_and_is_exact(ckpt, v4_sync):
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    llm = LLM(
        ckpt,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        async_scheduling=True,
        speculative_config=spec,
    )
    overlaps = _count_overlaps(llm.engine)
    greedy = [0, 2]
    outs = llm.generate([_v4_prompts()[i] for i in greedy], [V4_PARAMS[i] for i in greedy], use_tqdm=False)
    _same([v4_sync[i] for i in greedy], outs, atol=1e-5)
    assert overlaps["overlapped"] == 0 and llm.get_stats()["spec_num_draft_tokens"] > 0
    _no_leaks(llm.engine)


def test_ngram_with_async_scheduling_is_exact():
    rng = random.Random(5)
    prompts = [{"prompt_token_ids": [rng.randrange(2, 12) for _ in range(n)]} for n in (3, 20, 41)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outs = {}
    for spec, async_ in ((None, False), (ngram(3), True)):
        config = load_config(
            environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=512, speculative_config=spec
        )
        config = config.model_copy(update={"async_scheduling": async_})
        engine = LLMEngine(config, ToyHybridLM(), toy_backends(), ToyTokenizer(96), proposers=PROPOSERS)
        outs[async_] = LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)
        _no_leaks(engine)
    _same(outs[False], outs[True])


def test_structured_output_steps_synchronously_then_overlap_resumes():
    tok, backends = v4_tokenizer_and_grammars()
    prompt = {"prompt_token_ids": [0, 100, 200, 300]}
    params = [
        SamplingParams(
            temperature=1.0,
            seed=1,
            max_tokens=40,
            structured_outputs=StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}"),
        ),
        SamplingParams(
            temperature=1.0,
            seed=2,
            max_tokens=40,
            structured_outputs=StructuredOutputsParams(choice=["alpha", "beta"]),
        ),
        SamplingParams(temperature=1.0, seed=9, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
    ]
    outs, overlapped = {}, {}
    for async_ in (False, True):
        config = load_config(
            environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=256, async_scheduling=async_
        )
        model = ToyHybridLM(vocab_size=129280, max_pos=256)
        model.eos_token_ids = [tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")]
        engine = LLMEngine(config, model, toy_backends(), tok, backends)
        counts = _count_overlaps(engine)
        outs[async_] = LLM.from_engine(engine).generate([prompt] * 4, params, use_tqdm=False)
        overlapped[async_] = counts["overlapped"]
        _no_leaks(engine)
        assert len(engine.structured) == 0
    _same(outs[False], outs[True])
    assert overlapped[True] > 3  # once the constrained requests ended
    assert [o.outputs[0].finish_reason for o in outs[True][:2]] == ["stop", "stop"]
