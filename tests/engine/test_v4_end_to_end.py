"""The engine on a tiny random-weight DeepSeek-V4 checkpoint (a CSA and an HCA layer, each with its sliding
window; written by transformers' ``save_pretrained``, no tokenizer), CPU, float32. Kept small: the reference
ops run row by row (batch invariance), about 1-2 ms per token per layer on 2 cores."""

from __future__ import annotations

import random

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.kv.budget import group_block_bytes, min_blocks
from deepinfer_core.sampling_params import InvalidParameterError
from tests.graph_standin import stand_in_capture

from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf
from ..outputs import assert_same_outputs

VOCAB = 320


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    hf = build_hf(Schedule("engine", (CSA, HCA)), seed=0)
    path = tmp_path_factory.mktemp("v4")
    hf.save_pretrained(path)
    return hf, str(path)


def _llm(path: str, **kw) -> LLM:
    kw.setdefault("kv_cache_memory_bytes", 64 << 20)
    kw.setdefault("max_model_len", 512)
    return LLM(path, **kw)


def _prompts() -> list[dict]:
    rng = random.Random(7)
    lens = [1, 2, 16, 17, 40, 400, 64, 5] + [rng.randint(1, 48) for _ in range(12)]
    return [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in lens]


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=4, temperature=0.0, logprobs=2, ignore_eos=True)
        if i % 2 == 0
        else SamplingParams(max_tokens=4, temperature=0.9, top_p=0.95, seed=i, logprobs=1, ignore_eos=True)
        for i in range(20)
    ]


@pytest.fixture(scope="module")
def alone(v4):
    llm = _llm(v4[1], enable_prefix_caching=False, max_num_batched_tokens=4096)
    return [llm.generate([p], sp, use_tqdm=False)[0] for p, sp in zip(_prompts(), _params())]


@pytest.mark.parametrize("max_num_batched_tokens", [16, 48, 4096])
def test_v4_batch_of_20_matches_each_prompt_alone(v4, alone, max_num_batched_tokens):
    llm = _llm(v4[1], max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False)
    assert_same_outputs(alone, llm.generate(_prompts(), _params(), use_tqdm=False))


def test_v4_preemption_at_the_smallest_budget_changes_nothing(v4, alone):
    probe = _llm(v4[1], max_num_batched_tokens=48)
    specs, bs = probe.engine.model.cache_specs(), probe.engine.kv_layout.block_size
    need = min_blocks(specs, bs, 512, 48)
    budget = sum(need[g] * b for g, b in group_block_bytes(specs, bs).items())
    llm = _llm(v4[1], max_num_batched_tokens=48, kv_cache_memory_bytes=budget)
    idx = [5, 6, 4, 3, 2, 9]
    outs = llm.generate([_prompts()[i] for i in idx], [_params()[i] for i in idx], use_tqdm=False)
    assert llm.get_stats()["num_preemptions"] > 0
    assert_same_outputs([alone[i] for i in idx], outs)


def test_v4_prefix_cache_reuses_compressed_state_exactly(v4, alone):
    p = _prompts()
    shared = p[5]["prompt_token_ids"][:300]
    llm = _llm(v4[1], max_num_batched_tokens=128)
    first = llm.generate([{"prompt_token_ids": shared + [5, 6, 7]}], _params()[0], use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    out = llm.generate([p[5]], _params()[5], use_tqdm=False)[0]
    assert out.num_cached_tokens == 300 // 16 * 16  # every kind of state reused for 18 full blocks
    assert llm.get_stats()["prefix_cache_hits"] == out.num_cached_tokens
    assert_same_outputs([alone[5]], [out])


def test_v4_greedy_and_prompt_logprobs_match_transformers(v4):
    hf, path = v4
    rng = random.Random(11)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(n)] for n in (200, 45)]
    llm = _llm(path, max_num_batched_tokens=64)
    sp = SamplingParams(max_tokens=16, temperature=0.0, logprobs=1, prompt_logprobs=1, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    diffs, flips = [], 0
    for p, o in zip(prompts, outs):
        gen = o.outputs[0]
        assert len(o.prompt_logprobs) == len(p) and o.prompt_logprobs[0] is None
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([p + gen.token_ids])).logits[0].float(), -1)
        diffs += [abs(o.prompt_logprobs[i][p[i]].logprob - float(lp[i - 1, p[i]])) for i in range(1, len(p))]
        for j, tok in enumerate(gen.token_ids):
            row = lp[len(p) + j - 1]
            diffs.append(abs(gen.logprobs[j][tok].logprob - float(row[tok])))
            if int(row.argmax()) != tok:
                flips += 1
                assert float(row.max() - row[tok]) < 1e-3, (
                    "greedy token is not transformers' argmax nor a near tie"
                )
    assert sum(d <= 1e-3 for d in diffs) >= 0.97 * len(diffs)
    assert flips <= 2


def test_v4_checkpoint_without_tokenizer_serves_token_ids_only(v4):
    llm = _llm(v4[1])
    out = llm.generate(
        [{"prompt_token_ids": [3, 4, 5]}], SamplingParams(max_tokens=3, logprobs=0), use_tqdm=False
    )[0]
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].text == ""
    assert out.outputs[0].logprobs[0][out.outputs[0].token_ids[0]].decoded_token is None
    with pytest.raises(InvalidParameterError, match="no tokenizer"):
        llm.generate(["hello"], use_tqdm=False)
    with pytest.raises(InvalidParameterError, match="stop strings need a tokenizer"):
        llm.generate([{"prompt_token_ids": [3]}], SamplingParams(stop=["x"]), use_tqdm=False)


def _decode_heavy() -> tuple[list[dict], list[SamplingParams]]:
    """Requests that finish at different steps (the batch shrinks through buckets 8, 4, 2, 1) and cross
    the 256-token context bucket while decoding."""
    rng = random.Random(3)
    lens, steps = (1, 17, 40, 250, 5, 64), (24, 3, 10, 16, 30, 7)
    prompts = [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in lens]
    params = [
        SamplingParams(max_tokens=m, temperature=0.0 if i % 2 else 0.8, seed=i, logprobs=1, ignore_eos=True)
        for i, m in enumerate(steps)
    ]
    return prompts, params


@pytest.mark.parametrize("device_plan", [False, True], ids=["host_plan", "device_plan"])
@pytest.mark.parametrize("capture", [False, True], ids=["static", "replayed"])
def test_v4_static_decode_steps_match_dynamic_ones(v4, monkeypatch, capture, device_plan):
    """Decode steps with static shapes (rows padded to a batch bucket, candidate tables to a context bucket,
    unused compression entries written to the scratch block) give the dynamic steps' tokens and logprobs.

    ``replayed``: a stand-in for graph capture whose replay re-runs the captured closure over the captured
    buffers, so every later step reaches the model only through the runner's input copies; an input the
    forward reads but the runner does not copy would replay a stale step and fail this test.
    ``device_plan``: the slot plan is built inside the step from its positions and block tables (no plan
    from the host at all, checked by making the host's plan raise)."""
    prompts, params = _decode_heavy()
    dynamic = _llm(v4[1], max_num_batched_tokens=512).generate(prompts, params, use_tqdm=False)
    llm = _llm(v4[1], max_num_batched_tokens=512, device_plan=device_plan)
    runner = llm.engine.runner
    assert runner.device_plan is device_plan
    counts = stand_in_capture(runner, monkeypatch) if capture else {}
    runner.static_decode(8, capture=capture)
    if device_plan:
        real_plan = runner.model.plan

        def dynamic_only(batch, context_bucket=None):
            assert context_bucket is None, "a static step's plan was built on the host"
            return real_plan(batch, context_bucket)

        monkeypatch.setattr(runner.model, "plan", dynamic_only)
    assert_same_outputs(dynamic, llm.generate(prompts, params, use_tqdm=False))
    if capture:
        assert counts["captures"] == len(runner.graphs)
        assert {key[0] for key in runner.graphs} == {1, 2, 4, 8}
        assert {key[1] for key in runner.graphs} == {256, 512}
        assert counts["replays"] > 3 * counts["captures"]
        # a device graph's capture only records the step: every run, the capturing one too, must replay
        assert counts["replays"] == counts["runs"]


def test_stale_block_tables_would_fail_the_replayed_device_plan_test(v4, monkeypatch):
    """The replayed ``device_plan`` check above can fail: a step whose block tables are left out of the graph's
    inputs replays the captured step's tables, and the tokens differ from the dynamic steps'."""
    prompts, params = _decode_heavy()
    dynamic = _llm(v4[1], max_num_batched_tokens=512).generate(prompts, params, use_tqdm=False)
    llm = _llm(v4[1], max_num_batched_tokens=512, device_plan=True)
    runner = llm.engine.runner
    stand_in_capture(runner, monkeypatch)
    runner.static_decode(8, capture=True)
    real = runner.graphs.run
    monkeypatch.setattr(runner.graphs, "run", lambda key, fn, inputs, keep: real(key, fn, inputs[:2], keep))
    with pytest.raises(AssertionError):
        assert_same_outputs(dynamic, llm.generate(prompts, params, use_tqdm=False))
