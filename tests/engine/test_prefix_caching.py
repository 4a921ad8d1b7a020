"""Prefix caching reuses every kind of state (window and compressed) exactly."""

from __future__ import annotations

import random

from deepinfer_core import SamplingParams

from .conftest import make_toy_llm

BS = 16  # the toy's block size (lcm of its ratios 4 and 8, rounded up to 16)


def _shared(n_shared: int, suffixes: list[int], seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    base = [rng.randrange(2, 96) for _ in range(n_shared)]
    return [{"prompt_token_ids": base + [rng.randrange(2, 96) for _ in range(k)]} for k in suffixes]


GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=2, ignore_eos=True)


def test_later_request_reuses_a_finished_prefix_and_matches_caching_off():
    prompts = _shared(300, [37, 51, 5])
    off = make_toy_llm(enable_prefix_caching=False)
    ref = [off.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    on = make_toy_llm()
    outs = [on.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    shared_blocks = 300 // BS
    assert outs[0].num_cached_tokens == 0
    for o in outs[1:]:
        assert o.num_cached_tokens >= shared_blocks * BS
    assert on.get_stats()["prefix_cache_hits"] >= 2 * shared_blocks * BS
    for a, b in zip(ref, outs):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert {t: v.logprob for t, v in x.items()} == {t: v.logprob for t, v in y.items()}


def test_window_blocks_released_mid_prompt_stay_cached_for_resuming():
    """The first request runs past the shared prefix, so its window blocks there are released; a later
    request resumes from them (hit) instead of recomputing the prefix."""
    prompts = _shared(160, [200, 3])
    llm = make_toy_llm(max_num_batched_tokens=32)
    llm.generate([prompts[0]], GREEDY, use_tqdm=False)
    window = llm.engine.kv.pools["window"]
    assert window.num_in_use == 0 and len(window.evictable) > 0
    out = llm.generate([prompts[1]], GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 160 // BS * BS
    ref = make_toy_llm(enable_prefix_caching=False).generate([prompts[1]], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids


def test_request_reuses_the_prefix_of_a_running_request():
    prompts = _shared(200, [150, 4])
    llm = make_toy_llm(max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    eng = llm.engine
    items = eng.inputs.process(prompts, params)
    eng.add_request(items[0], "a")
    for _ in range(6):  # "a" has computed its 350-token prompt and is decoding
        eng.step()
    assert eng.requests["a"].seqs[0].num_output_tokens > 0
    eng.add_request(items[1], "b")
    outs = {}
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.request_id] = o
    assert outs["b"].num_cached_tokens == 200 // BS * BS
    ref = make_toy_llm(enable_prefix_caching=False).generate([prompts[1]], params, use_tqdm=False)[0]
    assert outs["b"].outputs[0].token_ids == ref.outputs[0].token_ids


def test_whole_prompt_cached_still_recomputes_the_last_block():
    p = _shared(64, [0])[0]
    llm = make_toy_llm()
    a = llm.generate([p], GREEDY, use_tqdm=False)[0]
    b = llm.generate([p], GREEDY, use_tqdm=False)[0]
    assert b.num_cached_tokens == 48  # 4 full blocks, the last is recomputed so logits exist
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_n_samples_share_the_prompt_kv():
    p = _shared(100, [0])[0]
    llm = make_toy_llm()
    sp = SamplingParams(n=4, max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    out = llm.generate([p], sp, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert llm.get_stats()["prefix_cache_hits"] >= 3 * (99 // BS) * BS
    again = make_toy_llm(enable_prefix_caching=False).generate([p], sp, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
