"""Engine features with V4.1 give what one request alone in one pass gives: chunked prefill (chunks that cut
windows, compression groups and the Engram look-back), continuous batching, preemption by recompute, prefix
caching (the window KV, compressor state and Engram look-back restored from cached blocks) and ``n > 1``.
Tiny reindex_r2 model, unquantized and quantized KV."""

from __future__ import annotations

import pytest

from deepinfer_core import LLM, SamplingParams
from tests.models.deepseek_v41.goldens import checkpoint, prompts

TOL = 1e-5


def _prompts() -> list[list[int]]:
    g, idx = prompts("reindex_r2")
    by_len = {len(g[f"prompt.{i}.ids"]): g[f"prompt.{i}.ids"].tolist() for i in idx}
    long, mid = by_len[96], by_len[65]
    return [
        by_len[30],
        mid,
        long,
        long[:41] + mid[1:20],
    ]  # the last shares 40 tokens (5 blocks of 8) with long


def _llm(kv: str, **kw) -> LLM:
    return LLM(model=str(checkpoint("reindex_r2")), kv_cache_dtype=kv, dtype="float32", block_size=8, **kw)


def _run(llm: LLM, ps: list[list[int]], params: SamplingParams, one_by_one: bool = False):
    if one_by_one:
        return [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in ps]
    return llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)


def _same(a, b, prompt_logprobs: bool = True) -> None:
    for x, y in zip(a, b, strict=True):
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert cx.token_ids == cy.token_ids
            for px, py in zip(cx.logprobs, cy.logprobs, strict=True):
                assert all(abs(px[t].logprob - py[t].logprob) <= TOL for t in px.keys() & py.keys())
        if prompt_logprobs:
            for px, py in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:], strict=True):
                assert all(abs(px[t].logprob - py[t].logprob) <= TOL for t in px.keys() & py.keys())


GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1, prompt_logprobs=1, ignore_eos=True)
NO_PROMPT = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1, ignore_eos=True)


@pytest.fixture(scope="module", params=["unquantized", "auto"])
def kv(request):
    return request.param


@pytest.fixture(scope="module")
def single(kv):
    """Every request alone, in one prefill step, no prefix cache."""
    llm = _llm(kv, enable_prefix_caching=False, max_num_batched_tokens=4096)
    return _run(llm, _prompts(), GREEDY, one_by_one=True), _run(llm, _prompts(), NO_PROMPT, one_by_one=True)


def test_chunked_prefill_and_batching_equal_single_passes(kv, single):
    llm = _llm(kv, enable_prefix_caching=False, max_num_batched_tokens=7)  # chunks cut windows of 8 and pairs
    _same(_run(llm, _prompts(), GREEDY), single[0])


def test_preemption_recomputes_the_same_results(kv, single):
    llm = _llm(
        kv,
        enable_prefix_caching=False,
        max_num_batched_tokens=64,
        kv_cache_memory_bytes=PREEMPT_BYTES[kv],
        max_model_len=128,
    )
    _same(_run(llm, _prompts(), NO_PROMPT), single[1], prompt_logprobs=False)
    assert llm.get_stats()["num_preemptions"] > 0


def test_prefix_cache_hit_restores_every_state(kv, single):
    llm = _llm(kv, enable_prefix_caching=True, max_num_batched_tokens=4096)
    ps = _prompts()
    out = _run(llm, ps, NO_PROMPT, one_by_one=True)  # the last prompt resumes from the third's blocks
    assert llm.get_stats()["prefix_cache_hits"] >= 40
    _same(out, single[1], prompt_logprobs=False)


def test_n_samples_have_the_logprobs_of_a_single_teacher_forced_pass(kv):
    """Two sampled continuations of one request: each token's reported logprob equals the prompt logprob
    of the same token when prompt + continuation is run as one prompt in one pass."""
    llm = _llm(kv, enable_prefix_caching=False)
    params = SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=7, logprobs=0, ignore_eos=True)
    prompt = _prompts()[1]
    out = _run(llm, [prompt], params)[0]
    assert len(out.outputs) == 2 and out.outputs[0].token_ids != out.outputs[1].token_ids
    one = _llm(kv, enable_prefix_caching=False, max_num_batched_tokens=4096)
    for c in out.outputs:
        full = prompt + c.token_ids
        ref = _run(one, [full], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
        for k, tok in enumerate(c.token_ids):
            assert abs(c.logprobs[k][tok].logprob - ref.prompt_logprobs[len(prompt) + k][tok].logprob) <= TOL


#: KV budgets small enough that the four requests cannot all stay resident (found by trying)
PREEMPT_BYTES = {"unquantized": 180_000, "auto": 60_000}
