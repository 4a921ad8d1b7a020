"""n-gram speculative decoding on the toy hybrid model: greedy output is unchanged token for token (and
logprobs), under small token budgets, preemption, prefix caching, n > 1, stop strings and max_tokens;
drafts get accepted on repetitive prompts; no block leaks; configuration errors are clear."""

from __future__ import annotations

import random

import pytest

from deepinfer_core import SamplingParams
from deepinfer_core.config import ConfigError, load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.kv.budget import group_block_bytes, min_blocks
from deepinfer_spec_decode.mtp import make_mtp
from deepinfer_spec_decode.ngram import make_ngram

from .conftest import toy_backends
from .toy_model import ToyHybridLM, ToyTokenizer

PROPOSERS = {"ngram": make_ngram, "mtp": make_mtp}


def spec_llm(spec: dict | None = None, **cfg) -> LLM:
    cfg.setdefault("kv_cache_memory_bytes", 8 << 20)
    cfg.setdefault("max_model_len", 512)
    config = load_config(environ={}, speculative_config=spec, **cfg)
    engine = LLMEngine(config, ToyHybridLM(), toy_backends(), ToyTokenizer(96), proposers=PROPOSERS)
    return LLM.from_engine(engine)


def ngram(k: int, lo: int = 1, hi: int = 3) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}


def _prompts() -> list[dict]:
    rng = random.Random(1)
    out = []
    for n in (1, 3, 9, 17, 40, 120, 7, 64):
        unit = [rng.randrange(2, 96) for _ in range(rng.randint(2, 6))]
        out.append({"prompt_token_ids": (unit * (n // len(unit) + 1))[:n]})
    out += [{"prompt_token_ids": [rng.randrange(2, 96) for _ in range(n)]} for n in (5, 33, 70)]
    return out


def _greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=2, ignore_eos=True, **kw)


def _same(a, b, atol: float = 1e-5) -> None:
    for x, y in zip(a, b, strict=True):
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert cx.token_ids == cy.token_ids
            assert cx.text == cy.text
            assert cx.finish_reason == cy.finish_reason
            for px, py in zip(cx.logprobs or (), cy.logprobs or (), strict=True):
                assert px.keys() == py.keys()
                assert max(abs(px[t].logprob - py[t].logprob) for t in px) <= atol


def _no_leaks(llm: LLM) -> None:
    for pool in llm.engine.kv.pools.values():
        assert pool.num_in_use == 0


@pytest.fixture(scope="module")
def plain():
    return spec_llm(enable_prefix_caching=False).generate(_prompts(), _greedy(), use_tqdm=False)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("max_num_batched_tokens", [8, 48, 4096])
def test_ngram_greedy_output_is_unchanged(plain, k, max_num_batched_tokens):
    llm = spec_llm(ngram(k), max_num_batched_tokens=max_num_batched_tokens)
    _same(plain, llm.generate(_prompts(), _greedy(), use_tqdm=False))
    stats = llm.get_stats()
    assert stats["spec_num_draft_tokens"] > 0
    assert 0 < stats["spec_num_accepted_tokens"] <= stats["spec_num_draft_tokens"]
    assert stats["num_generation_tokens"] == 24 * len(_prompts())
    _no_leaks(llm)


def test_ngram_accepts_on_repetitive_prompts_and_counts_per_position():
    llm = spec_llm(ngram(4))
    unit = [11, 12, 13, 14, 15]
    out = llm.generate([{"prompt_token_ids": unit * 8}], _greedy(max_tokens=40), use_tqdm=False)
    s = llm.get_stats()
    assert len(out[0].outputs[0].token_ids) == 40
    assert s["spec_num_accepted_tokens"] > 0
    assert s["spec_mean_acceptance_length"] > 1.0
    per = s["spec_acceptance_per_position"]
    assert len(per) == 4 and all(0.0 <= a <= 1.0 for a in per) and per[0] > 0
    # draft rounds save target steps: fewer verification rounds than generated tokens
    rounds = s["spec_num_draft_tokens"] and (
        s["spec_num_accepted_tokens"] / (s["spec_mean_acceptance_length"] - 1)
    )
    assert rounds < 40


def _min_budget(**kw) -> int:
    llm = spec_llm(**kw)
    specs, bs = llm.engine.model.cache_specs(), llm.engine.kv_layout.block_size
    need = min_blocks(specs, bs, llm.engine.max_model_len, llm.engine.config.max_num_batched_tokens)
    return sum(need[g] * b for g, b in group_block_bytes(specs, bs).items())


@pytest.mark.parametrize("caching", [False, True])
def test_ngram_under_preemption_changes_nothing(plain, caching):
    budget = _min_budget(max_num_batched_tokens=48)
    llm = spec_llm(
        ngram(3), max_num_batched_tokens=48, kv_cache_memory_bytes=budget, enable_prefix_caching=caching
    )
    _same(plain, llm.generate(_prompts(), _greedy(), use_tqdm=False))
    assert llm.get_stats()["num_preemptions"] > 0
    assert llm.get_stats()["spec_num_accepted_tokens"] > 0
    _no_leaks(llm)


def test_ngram_max_tokens_truncates_a_round():
    prompts = _prompts()
    params = [_greedy(max_tokens=m) for m in (1, 2, 3, 5, 8, 13, 21, 3, 4, 5, 6)]
    base = spec_llm().generate(prompts, params, use_tqdm=False)
    llm = spec_llm(ngram(5))
    out = llm.generate(prompts, params, use_tqdm=False)
    _same(base, out)
    for o, p in zip(out, params):
        assert len(o.outputs[0].token_ids) == p.max_tokens
    _no_leaks(llm)


def test_ngram_with_n_samples_and_prefix_cache_is_reproducible_and_leak_free():
    prompts = _prompts()
    params = [
        SamplingParams(max_tokens=m, n=3, temperature=0.8, seed=m, ignore_eos=True) for m in range(3, 14)
    ]
    runs = []
    for budget in (16, 4096):
        llm = spec_llm(ngram(3), max_num_batched_tokens=budget)
        out = llm.generate(prompts, params, use_tqdm=False)
        for o, p in zip(out, params):
            assert [len(c.token_ids) for c in o.outputs] == [p.max_tokens] * 3
        assert llm.get_stats()["prefix_cache_hits"] > 0
        assert llm.get_stats()["spec_num_accepted_tokens"] > 0
        _no_leaks(llm)
        runs.append([[c.token_ids for c in o.outputs] for o in out])
    assert runs[0] == runs[1]
    plain = spec_llm().generate(prompts, params, use_tqdm=False)
    assert runs[0] == [[c.token_ids for c in o.outputs] for o in plain]


def test_ngram_stop_strings_and_eos_truncate_a_round():
    unit = [20, 21, 22, 23]
    prompts = [{"prompt_token_ids": unit * 6}, {"prompt_token_ids": [30, 31, 1, 30, 31, 1, 30]}]
    tok = ToyTokenizer(96)
    stop = tok.decode([22, 23])
    params = [
        SamplingParams(max_tokens=30, temperature=0.0, stop=[stop], logprobs=1),
        SamplingParams(max_tokens=30, temperature=0.0, logprobs=1),
    ]
    base = spec_llm().generate(prompts, params, use_tqdm=False)
    out = spec_llm(ngram(4)).generate(prompts, params, use_tqdm=False)
    _same(base, out)


def test_seeded_sampling_emits_the_tokens_of_a_run_without_speculation():
    """Verification draws each emitted token with the sequence's generator like a plain step would, so a
    seeded request's output does not depend on speculation or batching."""
    prompts = _prompts()
    params = [
        SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=5, logprobs=1),
        SamplingParams(max_tokens=16, temperature=1.0, top_k=5, seed=6, repetition_penalty=1.3),
        SamplingParams(max_tokens=16, temperature=0.7, min_p=0.1, seed=7, min_tokens=4),
        SamplingParams(max_tokens=16, temperature=1.2, seed=8, presence_penalty=0.5, frequency_penalty=0.5),
    ] * 3
    params = params[: len(prompts)]
    base = spec_llm().generate(prompts, params, use_tqdm=False)
    for budget in (16, 4096):
        llm = spec_llm(ngram(3), max_num_batched_tokens=budget)
        _same(base, llm.generate(prompts, params, use_tqdm=False))
        assert llm.get_stats()["spec_num_accepted_tokens"] > 0


def test_configuration_errors_are_clear():
    with pytest.raises(ConfigError, match="installed proposers"):
        spec_llm({"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        spec_llm(ngram(9))
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        spec_llm({"method": "ngram"})
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        spec_llm(ngram(2, lo=3, hi=2))
    with pytest.raises(ConfigError, match="no mtp"):
        spec_llm({"method": "mtp", "num_speculative_tokens": 2})


def test_prefix_cache_never_sees_draft_tokens_and_block_references_stay_exact():
    """Each step: the KV manager's references equal the live tables, committed blocks lie below the
    computed length, and every sequence's block hashes are those of its verified tokens; a second engine
    pass over the same prompts reuses the cache and emits the same tokens."""
    llm = spec_llm(ngram(4), max_num_batched_tokens=24)
    engine, prompts = llm.engine, _prompts()
    for i, p in enumerate(prompts):
        engine.add_request(engine.inputs.process(p, _greedy())[0], str(i))
    outs = {}
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id] = o
        live = list(engine.scheduler.running) + list(engine.scheduler.waiting)
        engine.kv.check(live)
        bs = engine.kv.block_size
        for seq in live:
            assert seq.num_committed_blocks <= seq.num_computed // bs
            toks = seq.token_ids
            fresh = []
            for j in range(len(seq.block_hashes)):
                fresh.append(hash((fresh[-1] if fresh else 0x5EED_DEE9, tuple(toks[j * bs : (j + 1) * bs]))))
            assert seq.block_hashes == fresh
    assert engine.get_stats()["spec_num_accepted_tokens"] > 0
    again = llm.generate(prompts, _greedy(), use_tqdm=False)
    assert engine.get_stats()["prefix_cache_hits"] > 0
    _same([outs[str(i)] for i in range(len(prompts))], again)
    _no_leaks(llm)
