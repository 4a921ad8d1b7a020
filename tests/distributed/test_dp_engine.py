"""The engine across processes on gloo: DP attention + EP MoE give the single-process outputs exactly
(idle ranks running empty batches, EPLB rebalancing mid-generation), and a killed rank is named."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.distributed.vote import RankFailureError

from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf
from ..outputs import assert_same_outputs

VOCAB = 320
KW = dict(kv_cache_memory_bytes=32 << 20, max_model_len=512, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    """Layer 0 hash-routed, layer 1 top-k routed; 8 experts, top-2."""
    path = tmp_path_factory.mktemp("v4dp")
    build_hf(Schedule("dp", (CSA, HCA)), seed=0).save_pretrained(path)
    return str(path)


def _prompts(n: int = 7, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    lens = [1, 40, 5, 17, 90, 3, 24, 9][:n]
    return [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(k)]} for k in lens]


def _params(n: int = 7) -> list[SamplingParams]:
    # uneven lengths: ranks finish at different steps and then idle
    return [
        SamplingParams(
            max_tokens=[2, 9, 4, 6, 3, 8, 5, 2][i],
            temperature=0.0,
            logprobs=2,
            prompt_logprobs=1 if i == 3 else None,
            ignore_eos=True,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def single(ckpt):
    llm = LLM(ckpt, **KW)
    return llm.generate(_prompts(), _params(), use_tqdm=False), llm.generate(
        _prompts()[:1], _params()[:1], use_tqdm=False
    )


def test_dp2_ep2_with_eplb_mid_generation_matches_one_process(ckpt, single):
    llm = LLM(
        ckpt,
        data_parallel_size=2,
        expert_parallel=True,
        eplb={"num_redundant_experts": 2, "interval_steps": 3},
        **KW,
    )
    try:
        assert_same_outputs(single[0], llm.generate(_prompts(), _params(), use_tqdm=False))
        stats = llm.get_stats()
        assert stats["eplb_rebalances"] >= 2  # placements changed while sequences were running
        assert stats["eplb_imbalance_after"] <= stats["eplb_imbalance_before"]
        assert stats["dp_idle_steps"] > 0  # a rank ran empty batches while the other worked
        assert stats["num_requests"] == 7
        # one prompt: rank 1 has nothing to do in every step
        assert_same_outputs(single[1], llm.generate(_prompts()[:1], _params()[:1], use_tqdm=False))
        assert llm.get_stats()["dp_idle_steps"] >= 2
    finally:
        llm.engine.close()


def test_dp4_ep4_matches_one_process(ckpt, single):
    llm = LLM(ckpt, data_parallel_size=4, expert_parallel=True, **KW)
    try:
        assert_same_outputs(single[0], llm.generate(_prompts(), _params(), use_tqdm=False))
        assert [m.routed.num_local_experts for m in llm.engine.rank.ep.layers] == [2, 2]
    finally:
        llm.engine.close()


def _fail_rank_1_at_step_3(llm, sig: int) -> None:
    """Rank 0 sends ``sig`` to rank 1 right before its third step (SIGKILL: dies; SIGSTOP: hangs)."""
    eng = llm.engine
    victim, real_step, calls = eng.ctx.procs[0], eng.rank.engine.step, []

    def step():
        calls.append(1)
        if len(calls) == 3:
            os.kill(victim.pid, sig)
            if sig == signal.SIGKILL:
                victim.join()
        return real_step()

    eng.rank.engine.step = step


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["dies", "hangs"])
def test_a_failed_rank_is_named_by_the_others_within_the_timeout(ckpt, monkeypatch, sig):
    # 10 s: long enough that a healthy rank's step never times out on a loaded two-core machine running
    # another test file beside this one
    monkeypatch.setenv("DEEPINFER_DIST_TIMEOUT_S", "10")
    llm = LLM(ckpt, data_parallel_size=3, expert_parallel=True, eplb={"num_redundant_experts": 1}, **KW)
    eng = llm.engine
    _fail_rank_1_at_step_3(llm, sig)
    t0 = time.monotonic()
    with pytest.raises(RankFailureError, match=r"failed rank\(s\): \[1\]") as info:
        llm.generate(_prompts(), _params(), use_tqdm=False)
    assert info.value.ranks == [1]
    survivor = eng.ctx.procs[1]  # rank 2
    survivor.join(30)
    assert survivor.exitcode == 1
    assert "failed rank(s): [1]" in eng.ctx.store.get("deepinfer/diagnosis/2").decode()
    assert not eng.ctx.procs[0].is_alive()
    assert time.monotonic() - t0 < 40  # timeout 10 s + grace 3 s + exits
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(_prompts()[:1], _params()[:1], use_tqdm=False)


def test_cli_generate_with_data_parallel_and_expert_parallel(ckpt, single, tmp_path, capsys):
    from deepinfer_core.cli.main import main

    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps(p) for p in _prompts()[:3]))
    argv = [
        "generate",
        "--model",
        ckpt,
        "--input-file",
        str(f),
        "--data-parallel-size",
        "2",
        "--expert-parallel",
    ]
    argv += [
        "--max-tokens",
        "2",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
        "--kv-cache-memory-bytes",
        str(32 << 20),
    ]
    assert main(argv) == 0
    recs = json.loads(capsys.readouterr().out)
    assert [r["outputs"][0]["token_ids"] for r in recs] == [o.outputs[0].token_ids[:2] for o in single[0][:3]]


def test_a_survivor_that_exited_first_is_not_named(monkeypatch):
    """Rank 1 hangs; rank 2 times out first, marks itself a survivor ("peer") and exits; rank 0's own
    timeout fires after that. Rank 0 must name rank 1 (silent), not rank 2 (dead, but a survivor)."""
    import types

    import torch.distributed as dist

    from deepinfer_core.engine import dp_engine

    monkeypatch.setattr(dp_engine, "_GRACE_S", 0.2)
    store = dist.HashStore()
    store.set("deepinfer/failed/2", "peer: timed out")
    procs = [types.SimpleNamespace(exitcode=None), types.SimpleNamespace(exitcode=1)]  # ranks 1 and 2
    fake = types.SimpleNamespace(ctx=types.SimpleNamespace(procs=procs))
    assert dp_engine.RankEngine._failed_ranks(fake, store, 0, 3) == [1]
    procs[0].exitcode = -9  # and when rank 1 is dead too, it alone is named at once
    assert dp_engine.RankEngine._failed_ranks(fake, store, 0, 3) == [1]
