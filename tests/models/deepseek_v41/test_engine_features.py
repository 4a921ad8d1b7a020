"""Engine features with V4.1 give what one request alone in one pass gives (tiny reindex_r2 model):

- unquantized KV: chunked prefill (chunks that cut windows, compression groups and the Engram look-back),
  continuous batching, batch invariance on the reference backend (bit-identical logprobs alone and in a
  batch), preemption by recompute, prefix caching (the window KV, compressor state and Engram look-back
  restored from cached blocks), ``n > 1`` with a seed, and structured output (a JSON schema through xgrammar);
- the trained FP8 / FP4 KV (``kv_cache_dtype="auto"``): chunked prefill with batching and a prefix-cache hit,
  on two shorter prompts (the packed formats are what differs; the scheduler paths are the same).

Every engine is built once per module; the single-pass results are the oracle of every test."""

from __future__ import annotations

import json

import pytest

from deepinfer_core import LLM, SamplingParams, StructuredOutputsParams
from tests.models.deepseek_v41.goldens import checkpoint, prompts

TOL = 1e-5


def _by_len() -> dict[int, list[int]]:
    g, idx = prompts("reindex_r2")
    return {len(g[f"prompt.{i}.ids"]): g[f"prompt.{i}.ids"].tolist() for i in idx}


def _prompts() -> list[list[int]]:
    by_len = _by_len()
    long, mid = by_len[96], by_len[65]
    return [
        by_len[30],
        mid,
        long,
        long[:41] + mid[1:20],
    ]  # the last shares 40 tokens (5 blocks of 8) with long


def _quantized_prompts() -> list[list[int]]:
    by_len = _by_len()
    mid = by_len[65]
    return [mid, mid[:41] + by_len[30][1:12]]  # the second shares 40 tokens with the first


def _llm(kv: str, **kw) -> LLM:
    return LLM(model=str(checkpoint("reindex_r2")), kv_cache_dtype=kv, dtype="float32", block_size=8, **kw)


def _run(llm: LLM, ps: list[list[int]], params, one_by_one: bool = False):
    if one_by_one:
        return [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in ps]
    return llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)


def _close(a: dict, b: dict, tol: float) -> bool:
    keys = a.keys() & b.keys()
    return bool(keys) and all(abs(a[t].logprob - b[t].logprob) <= tol for t in keys)


def _same(a, b, prompt_logprobs: bool = True, tol: float = TOL) -> None:
    for x, y in zip(a, b, strict=True):
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert cx.token_ids == cy.token_ids
            assert all(_close(px, py, tol) for px, py in zip(cx.logprobs, cy.logprobs, strict=True))
        if prompt_logprobs:
            pairs = zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:], strict=True)
            assert all(_close(px, py, tol) for px, py in pairs)


GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1, prompt_logprobs=1, ignore_eos=True)
NO_PROMPT = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1, ignore_eos=True)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "tag"],
    "additionalProperties": False,
}
SCHEMA_TAGS = SCHEMA["properties"]["tag"]["enum"]
JSON_OUT = SamplingParams(
    max_tokens=40,
    temperature=0.0,
    logprobs=1,
    structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
)


@pytest.fixture(scope="module")
def single():
    """``(llm, results)``: every request alone, in one prefill step, no prefix cache, unquantized KV."""
    llm = _llm(
        "unquantized",
        enable_prefix_caching=False,
        max_num_batched_tokens=4096,
        structured_outputs_backend="xgrammar",
    )
    return llm, _run(llm, _prompts(), GREEDY, one_by_one=True)


@pytest.fixture(scope="module")
def single_quantized():
    llm = _llm("auto", enable_prefix_caching=False, max_num_batched_tokens=4096)
    return _run(llm, _quantized_prompts(), GREEDY, one_by_one=True)


def test_chunked_prefill_and_batching_equal_single_passes(single):
    llm = _llm(
        "unquantized", enable_prefix_caching=False, max_num_batched_tokens=7
    )  # cuts windows of 8, pairs
    _same(_run(llm, _prompts(), GREEDY), single[1])


def test_quantized_kv_chunked_prefill_and_batching_equal_single_passes(single_quantized):
    llm = _llm("auto", enable_prefix_caching=False, max_num_batched_tokens=7)
    _same(_run(llm, _quantized_prompts(), GREEDY), single_quantized)


def test_batch_invariance_and_structured_output_in_a_batch(single):
    """One step holds a JSON-constrained request and the four plain ones: the plain ones' prompt and sample
    logprobs are bit-identical to each alone, the constrained one equals itself alone and obeys the schema."""
    llm, alone = single
    so_alone = llm.generate([{"prompt_token_ids": _prompts()[0]}], JSON_OUT, use_tqdm=False)[0]
    batch = llm.generate(
        [{"prompt_token_ids": p} for p in [_prompts()[0], *_prompts()]],
        [JSON_OUT] + [GREEDY] * 4,
        use_tqdm=False,
    )
    _same(batch[1:], alone, tol=0.0)
    _same(batch[:1], [so_alone], prompt_logprobs=False, tol=0.0)
    out = batch[0].outputs[0]
    assert out.finish_reason == "stop"
    value = json.loads(out.text)
    assert set(value) == {"ok", "tag"} and isinstance(value["ok"], bool) and value["tag"] in SCHEMA_TAGS
    assert out.token_ids != alone[0].outputs[0].token_ids[: len(out.token_ids)]  # the grammar changed it


def test_preemption_recomputes_the_same_results(single):
    llm = _llm(
        "unquantized",
        enable_prefix_caching=False,
        max_num_batched_tokens=64,
        kv_cache_memory_bytes=PREEMPT_BYTES,
        max_model_len=128,
    )
    _same(_run(llm, _prompts(), NO_PROMPT), single[1], prompt_logprobs=False)
    assert llm.get_stats()["num_preemptions"] > 0


def test_prefix_cache_hit_restores_every_state(single):
    llm = _llm("unquantized", enable_prefix_caching=True, max_num_batched_tokens=4096)
    out = _run(llm, _prompts()[2:], NO_PROMPT, one_by_one=True)  # the last resumes from the first's blocks
    assert llm.get_stats()["prefix_cache_hits"] >= 40
    _same(out, single[1][2:], prompt_logprobs=False)


def test_quantized_kv_prefix_cache_hit_restores_every_state(single_quantized):
    llm = _llm("auto", enable_prefix_caching=True, max_num_batched_tokens=4096)
    out = _run(llm, _quantized_prompts(), NO_PROMPT, one_by_one=True)
    assert llm.get_stats()["prefix_cache_hits"] >= 40
    _same(out, single_quantized, prompt_logprobs=False)


def test_n_samples_equal_seeded_requests_and_a_teacher_forced_pass(single):
    """``n=2, seed=7``: sample 0 is the request with ``n=1, seed=7`` (sample ``k`` draws from its own stream
    of the seed); the two samples differ; each token's logprob equals the prompt logprob of the same token
    when prompt + continuation is run as one prompt in one pass."""
    llm, _ = single
    prompt = _prompts()[1]
    params = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=7, logprobs=0, ignore_eos=True)
    out = _run(llm, [prompt], params)[0]
    assert len(out.outputs) == 2 and out.outputs[0].token_ids != out.outputs[1].token_ids
    one = _run(
        llm, [prompt], SamplingParams(max_tokens=6, temperature=1.0, seed=7, logprobs=0, ignore_eos=True)
    )
    assert one[0].outputs[0].token_ids == out.outputs[0].token_ids
    full = [prompt + list(c.token_ids) for c in out.outputs]
    refs = _run(llm, full, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))
    for c, ref in zip(out.outputs, refs, strict=True):
        for k, tok in enumerate(c.token_ids):
            assert abs(c.logprobs[k][tok].logprob - ref.prompt_logprobs[len(prompt) + k][tok].logprob) <= TOL


#: a KV budget small enough that the four requests cannot all stay resident (found by trying)
PREEMPT_BYTES = 180_000
