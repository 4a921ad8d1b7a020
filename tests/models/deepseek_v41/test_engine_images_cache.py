"""Image requests under prefix caching and preemption (V4.1, reference backend, float32, unquantized KV):

- the prefix cache keys a block that overlaps an image span by the image's content too: the same prompt and
  image hits every full block before the last token, the same token ids with another image of the same size
  hit only the blocks before the span, and both give what an engine without the cache gives;
- preemption by recompute re-encodes the image (the embeddings are dropped once the prompt's spans are
  computed; docs/vision.md) and gives what an unpreempted run gives."""

from __future__ import annotations

import pytest

from deepinfer_core import LLM, SamplingParams
from tests.models.deepseek_v41.vl_goldens import CHECKPOINT, engine_input, goldens, image

BLOCK = 8
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, logprobs=0, ignore_eos=True)


def _llm(**kw) -> LLM:
    return LLM(model=str(CHECKPOINT), dtype="float32", kv_cache_dtype="unquantized", block_size=BLOCK, **kw)


def _logprobs(out) -> list[float]:
    c = out.outputs[0]
    return [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)]


def _same(a, b) -> None:
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert _logprobs(a) == pytest.approx(_logprobs(b), abs=1e-5)


@pytest.fixture(scope="module")
def uncached() -> LLM:
    return _llm(enable_prefix_caching=False)


def test_same_image_hits_and_another_image_misses_the_span_blocks(uncached):
    start, length = goldens()[1]["prompts"][0]["spans"][0]  # prompt 0: one image, at 21..30 of 44
    mirrored = [image("a").transpose(0)]  # the same size: the same token ids, other pixels
    llm = _llm(enable_prefix_caching=True)
    first = llm.generate([engine_input(0)], GREEDY, use_tqdm=False)[0]
    hits = llm.get_stats()["prefix_cache_hits"]
    other = llm.generate([engine_input(0, mirrored)], GREEDY, use_tqdm=False)[0]
    other_hits = llm.get_stats()["prefix_cache_hits"] - hits
    again = llm.generate([engine_input(0)], GREEDY, use_tqdm=False)[0]
    again_hits = llm.get_stats()["prefix_cache_hits"] - hits - other_hits
    n = len(first.prompt_token_ids)
    assert other_hits == start // BLOCK * BLOCK  # the blocks before the span's first block only
    assert again_hits == (n - 1) // BLOCK * BLOCK > start + length  # through the span
    base_same, base_other = uncached.generate(
        [engine_input(0), engine_input(0, mirrored)], GREEDY, use_tqdm=False
    )
    _same(first, base_same)
    _same(again, base_same)
    _same(other, base_other)
    assert _logprobs(other) != pytest.approx(_logprobs(base_same), abs=1e-3)  # the image matters


def test_preempted_image_requests_give_the_unpreempted_results(uncached):
    prompts = [engine_input(i) for i in (0, 1, 2)]  # every request has images
    kw = dict(enable_prefix_caching=False, max_num_batched_tokens=32, max_model_len=96)
    # the smallest KV budget for these settings (min_blocks of every group): requests must be preempted
    llm = _llm(kv_cache_memory_bytes=92_544, **kw)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.get_stats()["num_preemptions"] > 0
    for got, want in zip(outs, uncached.generate(prompts, GREEDY, use_tqdm=False), strict=True):
        _same(got, want)
