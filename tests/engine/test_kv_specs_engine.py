"""The engine with V4.1-shaped state (tests/engine/toy_csa2.py): open groups, shared-reader specs, ratio-1 and
ratio-2 entries and packed FP4 / FP8 pools, allocated as declared and restored exactly by prefix caching."""

from __future__ import annotations

import random

import pytest
import torch

from deepinfer_core import SamplingParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.kv.spec import CacheSpec

from .conftest import toy_backends
from .toy_csa2 import FP4, FP8, ToyCSA2LM, make_csa2_llm, pack_fp4, pack_fp8, unpack_fp4, unpack_fp8

BS = 16
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2, ignore_eos=True)


def _shared(n_shared: int, suffixes: list[int], seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    base = [rng.randrange(2, 96) for _ in range(n_shared)]
    return [{"prompt_token_ids": base + [rng.randrange(2, 96) for _ in range(k)]} for k in suffixes]


def _same(a, b) -> None:
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
        assert {t: v.logprob for t, v in x.items()} == {t: v.logprob for t, v in y.items()}


def test_the_toy_s_packers_round_trip_within_their_formats():
    x = torch.randn(5, 32)
    assert torch.allclose(unpack_fp8(pack_fp8(x)), x, rtol=0.07, atol=1e-3)
    assert torch.allclose(unpack_fp4(pack_fp4(x)), x, rtol=0.3, atol=0.3 * x.abs().max().item())
    assert pack_fp4(x).shape == (5, FP4.entry_bytes) == (5, 18) and pack_fp8(x).shape == (5, 33)


def test_the_runner_allocates_one_pool_per_spec_in_its_declared_bytes():
    llm = make_csa2_llm()
    eng = llm.engine
    pools, layout = eng.runner.kv, eng.kv_layout
    assert set(pools) == {s.name for s in eng.model.cache_specs()}
    assert pools["l1.ckv"].dtype == torch.uint8 and pools["l1.ckv"].shape == (
        layout.num_blocks["global"] + 1,
        8,
        18,
    )
    assert pools["l2.gkv"].shape == (layout.num_blocks["global"] + 1, 16, FP8.entry_bytes)
    assert layout.block_bytes["global"] == 8 * 18 + 16 * 33
    assert sorted(eng.kv.pools) == ["dec", "global", "partial", "swa"]
    assert eng.kv.windows == {"dec": 3, "global": None, "partial": 1, "swa": 8}


def test_later_requests_resume_from_every_kind_of_state_and_match_caching_off():
    prompts = _shared(150, [40, 9, 1])
    ref = [
        make_csa2_llm(enable_prefix_caching=False).generate([p], GREEDY, use_tqdm=False)[0] for p in prompts
    ]
    llm = make_csa2_llm(max_num_batched_tokens=48)
    outs = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    assert outs[0].num_cached_tokens == 0
    assert [o.num_cached_tokens for o in outs[1:]] == [144, 144]
    for a, b in zip(ref, outs):
        _same(a, b)
    llm.engine.kv.check([])


def test_a_batch_resumes_from_a_finished_request_s_prefix():
    prompts = _shared(100, [60, 20])
    ref = make_csa2_llm(enable_prefix_caching=False).generate(prompts, GREEDY, use_tqdm=False)
    llm = make_csa2_llm(max_num_batched_tokens=32)
    llm.generate([prompts[0]], GREEDY, use_tqdm=False)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.num_cached_tokens for o in outs] == [144, 96]
    for a, b in zip(ref, outs):
        _same(a, b)


def test_specs_are_checked_when_the_engine_is_built():
    class Twice(ToyCSA2LM):
        def cache_specs(self):
            return super().cache_specs() + [CacheSpec("l0.win", "swa", 1, (32,), torch.float32, window=8)]

    class Outside(ToyCSA2LM):
        num_layers = 4  # l4.win names layer 4

    for model, match in ((Twice(), "unique"), (Outside(), "outside 0..3")):
        with pytest.raises(ValueError, match=match):
            LLMEngine(
                load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=512),
                model,
                toy_backends(),
            )
