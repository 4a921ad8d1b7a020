"""Results do not depend on batching, chunking, preemption or the prefix cache (toy hybrid model)."""

from __future__ import annotations

import random

import pytest

from deepinfer_core import SamplingParams
from deepinfer_core.kv.budget import KVBudgetError, group_block_bytes, min_blocks

from .conftest import make_toy_llm


def _prompts(n: int = 20, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    lens = [1, 2, 15, 16, 17, 63, 64, 65, 400, 399] + [rng.randint(1, 400) for _ in range(n - 10)]
    return [{"prompt_token_ids": [rng.randrange(2, 96) for _ in range(n_)]} for n_ in lens[:n]]


def _params(n: int) -> list[SamplingParams]:
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(SamplingParams(max_tokens=6, temperature=0.0, logprobs=3, ignore_eos=True))
        elif i % 3 == 1:
            out.append(SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=100 + i, logprobs=2))
        else:
            out.append(SamplingParams(max_tokens=6, temperature=1.0, top_k=20, logprobs=0))
    return out


def _same(a, b, atol: float = 1e-5) -> None:
    for x, y in zip(a, b, strict=True):
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert cx.token_ids == cy.token_ids
            assert cx.finish_reason == cy.finish_reason
            for px, py in zip(cx.logprobs, cy.logprobs, strict=True):
                assert px.keys() == py.keys()
                for t in px:
                    assert abs(px[t].logprob - py[t].logprob) <= atol
                    assert px[t].rank == py[t].rank


@pytest.fixture(scope="module")
def alone():
    """Each prompt on its own, in a fresh engine with no prefix cache and a large token budget."""
    prompts, params = _prompts(), _params(20)
    outs = []
    for i, (p, sp) in enumerate(zip(prompts, params)):
        llm = make_toy_llm(enable_prefix_caching=False, max_num_batched_tokens=4096)
        llm.engine._arrivals = iter(
            range(i, 10**9)
        )  # same request index as in the batch: same unseeded stream
        outs.append(llm.generate([p], sp, use_tqdm=False)[0])
    return outs


@pytest.mark.parametrize("max_num_batched_tokens", [16, 48, 4096])
def test_batch_of_20_mixed_lengths_matches_each_prompt_alone(alone, max_num_batched_tokens):
    llm = make_toy_llm(max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False)
    outs = llm.generate(_prompts(), _params(20), use_tqdm=False)
    _same(alone, outs)


def _min_budget(llm_kwargs: dict) -> int:
    llm = make_toy_llm(**llm_kwargs)
    specs = llm.engine.model.cache_specs()
    bs = llm.engine.kv_layout.block_size
    need = min_blocks(specs, bs, llm.engine.max_model_len, llm.engine.config.max_num_batched_tokens)
    nbytes = group_block_bytes(specs, bs)
    return sum(need[g] * nbytes[g] for g in need)


def test_smallest_budget_is_accepted_and_one_byte_less_is_refused_with_the_numbers():
    budget = _min_budget(dict(max_num_batched_tokens=48))
    make_toy_llm(max_num_batched_tokens=48, kv_cache_memory_bytes=budget)
    with pytest.raises(KVBudgetError) as e:
        make_toy_llm(max_num_batched_tokens=48, kv_cache_memory_bytes=budget - 1)
    msg = str(e.value)
    assert f"needs {budget} bytes" in msg and f"{budget - 1} bytes are available" in msg
    fit = int(msg.split("largest max_model_len that fits is ")[1].split(".")[0])
    assert 0 < fit < 512
    make_toy_llm(max_num_batched_tokens=48, kv_cache_memory_bytes=budget - 1, max_model_len=fit)


@pytest.mark.parametrize("caching", [False, True])
def test_preemption_at_the_smallest_budget_changes_nothing(alone, caching):
    budget = _min_budget(dict(max_num_batched_tokens=48))
    llm = make_toy_llm(max_num_batched_tokens=48, kv_cache_memory_bytes=budget, enable_prefix_caching=caching)
    outs = llm.generate(_prompts(), _params(20), use_tqdm=False)
    assert llm.get_stats()["num_preemptions"] > 0
    _same(alone, outs)
    for pool in llm.engine.kv.pools.values():
        assert pool.num_in_use == 0
