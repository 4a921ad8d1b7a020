"""MTP speculative decoding on a tiny random DeepSeek-V4 checkpoint with random ``mtp.0.*`` weights (CSA and
HCA layers, window 8, compression 4 / 16), CPU, float32: greedy output is unchanged for k = 1..4 (modules
reused in turn past the checkpoint's one), under small token budgets and preemption; every first draft is
the MTP module's prediction over the full context (the catch-up covers every verified position); rejected
rounds leave exactly the cache state of a run that never drafted."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.config import ConfigError
from deepinfer_core.engine.sampler import sampling_tensors
from deepinfer_core.kv.budget import group_block_bytes, min_blocks
from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.spec_decode import Draft
from deepinfer_core.testing.kv_harness import PagedKVHarness
from tests.graph_standin import stand_in_capture

from ..models.deepseek_v4.test_mtp import MTPReference
from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf, save_deepseek
from ..outputs import assert_same_outputs

VOCAB = 320


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    hf = build_hf(Schedule("engine", (CSA, HCA)), seed=0)
    extra = MTPReference(hf).deepseek_tensors()
    return str(save_deepseek(hf, tmp_path_factory.mktemp("v4mtp"), extra=extra))


@pytest.fixture(scope="module")
def ckpt_no_mtp(tmp_path_factory):
    hf = build_hf(Schedule("engine", (CSA, HCA)), seed=0)
    return str(save_deepseek(hf, tmp_path_factory.mktemp("v4")))


def _llm(path: str, k: int | None = None, draft_sampling: str = "sample", **kw) -> LLM:
    kw.setdefault("kv_cache_memory_bytes", 64 << 20)
    kw.setdefault("max_model_len", 256)
    if k is not None:
        kw["speculative_config"] = {
            "method": "mtp",
            "num_speculative_tokens": k,
            "draft_sampling": draft_sampling,
        }
    return LLM(path, **kw)


def _prompts() -> list[dict]:
    rng = random.Random(11)
    # lengths around the window (8) and the compression ratios (4, 16)
    return [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in (1, 7, 15, 16, 33)]


PARAMS = [
    SamplingParams(max_tokens=m, temperature=0.0, logprobs=2, ignore_eos=True) for m in (19, 12, 18, 17, 9)
]


@pytest.fixture(scope="module")
def plain(ckpt):
    return _llm(ckpt, enable_prefix_caching=False).generate(_prompts(), PARAMS, use_tqdm=False)


def _no_leaks(llm: LLM) -> None:
    for pool in llm.engine.kv.pools.values():
        assert pool.num_in_use == 0


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_mtp_greedy_output_is_unchanged(ckpt, plain, k):
    llm = _llm(ckpt, k, max_num_batched_tokens=64)
    assert_same_outputs(plain, llm.generate(_prompts(), PARAMS, use_tqdm=False))
    s = llm.get_stats()
    assert s["spec_num_draft_tokens"] > 0
    assert len(s["spec_acceptance_per_position"]) == k
    _no_leaks(llm)


def test_mtp_under_a_small_token_budget_and_preemption(ckpt, plain):
    probe = _llm(ckpt, 3, max_num_batched_tokens=16)
    specs, bs = probe.engine.model.cache_specs(), probe.engine.kv_layout.block_size
    need = min_blocks(specs, bs, 256, 16)
    budget = sum(need[g] * b for g, b in group_block_bytes(specs, bs).items())
    llm = _llm(ckpt, 3, max_num_batched_tokens=16, kv_cache_memory_bytes=budget)
    assert_same_outputs(plain, llm.generate(_prompts(), PARAMS, use_tqdm=False))
    assert llm.get_stats()["num_preemptions"] > 0
    _no_leaks(llm)


def test_first_draft_is_the_mtp_prediction_over_the_full_context(ckpt):
    """Record each first draft; recompute MTP module 0 over the final sequence on fresh pools: the draft
    after ``L`` tokens must be the argmax at position ``L - 2`` (it saw every earlier position)."""
    llm = _llm(ckpt, 1, max_num_batched_tokens=12)
    prop = llm.engine.proposer
    seen: list[tuple[list[int], int]] = []
    original = prop.propose

    def spy(seqs, limits):
        drafts = original(seqs, limits)
        seen.extend((list(s.token_ids), d[0]) for s, d in zip(seqs, drafts) if d)
        return drafts

    prop.propose = spy
    prompts = _prompts()[2:4]
    outs = llm.generate(prompts, PARAMS[2:4], use_tqdm=False)
    model = llm.engine.model
    for p, o in zip(prompts, outs):
        ids = p["prompt_token_ids"] + o.outputs[0].token_ids
        h = PagedKVHarness(model.cache_specs(), block_size=16, num_blocks=64)
        s = h.add_sequence()
        with torch.inference_mode():
            streams = model.forward(h.step({s: ids}), h.pools)
            batch = h.step({s: ids[1:]}, positions_from={s: 0})
            want = model.mtp_compute_logits(0, model.mtp_forward(0, batch, streams[:-1], h.pools))
        mine = [(t, d) for t, d in seen if ids[: len(t)] == t]
        assert len(mine) >= 5
        for toks, draft in mine:
            assert draft == int(torch.argmax(want[len(toks) - 2]))


def _visible_state(engine, seq) -> dict[str, torch.Tensor]:
    """Every main-model cache entry a next step may read: the window before ``num_computed`` and every
    closed compressed entry."""
    out, bs, n = {}, engine.kv.block_size, seq.num_computed
    window = engine.kv.windows.get("window") or 0
    for spec in engine.model.cache_specs():
        if spec.name.startswith("mtp."):
            continue
        pool, table, epb = (
            engine.runner.kv[spec.name],
            seq.block_tables[spec.group],
            bs // spec.tokens_per_entry,
        )
        if spec.group == "window":
            entries = range(max(0, n - window), n)
        else:
            entries = range(n // spec.tokens_per_entry)
        rows = [pool[table[e * spec.tokens_per_entry // bs], e % epb] for e in entries]
        out[spec.name] = torch.stack(rows) if rows else torch.empty(0)
    return out


def test_rounds_with_every_draft_rejected_leave_the_state_of_a_run_without_drafts(ckpt):
    spec, ref = _llm(ckpt, 4), _llm(ckpt)
    prompt = _prompts()[4]
    sp = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for llm in (spec, ref):
        llm.engine.add_request(llm.engine.inputs.process(prompt, sp)[0], "r")
    compared = 0
    while spec.engine.has_unfinished():
        before = spec.get_stats()["spec_num_draft_tokens"]
        spec.engine.step()
        ref.engine.step()
        s = spec.get_stats()
        rejected_round = s["spec_num_draft_tokens"] > before and s["spec_num_accepted_tokens"] == 0
        if not spec.engine.requests or not rejected_round:
            continue
        a, b = (llm.engine.requests["r"].seqs[0] for llm in (spec, ref))
        assert a.num_computed == b.num_computed and a.token_ids == b.token_ids
        va, vb = _visible_state(spec.engine, a), _visible_state(ref.engine, b)
        for name in va:
            torch.testing.assert_close(va[name], vb[name], rtol=0, atol=1e-6, msg=name)
        compared += 1
    assert compared >= 5
    assert spec.get_stats()["spec_num_accepted_tokens"] == 0


def test_mtp_without_mtp_weights_fails_at_construction(ckpt_no_mtp):
    with pytest.raises(ConfigError, match="no mtp"):
        _llm(ckpt_no_mtp, 2)


def test_mtp_greedy_drafts_for_seeded_sampling_with_n_samples_and_prefix_cache_emit_the_plain_tokens(ckpt):
    """``draft_sampling="greedy"``: one-hot drafts, so the verifier draws exactly as plain sampling does."""
    rng = random.Random(5)
    prompts = [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in (70, 15, 140)]
    params = [
        SamplingParams(max_tokens=10, temperature=0.9, top_k=40, seed=3, n=2, ignore_eos=True, logprobs=1),
        SamplingParams(max_tokens=7, temperature=1.0, seed=4, n=3, ignore_eos=True, repetition_penalty=1.2),
        SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True),
    ]
    base = _llm(ckpt, enable_prefix_caching=False).generate(prompts, params, use_tqdm=False)
    llm = _llm(ckpt, 2, "greedy", max_num_batched_tokens=24)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(base, outs):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert llm.get_stats()["prefix_cache_hits"] > 0
    _no_leaks(llm)


def test_mtp_samples_the_drafts_of_a_sampling_request_and_returns_their_q(ckpt):
    """A sampling request's drafts are drawn from the request's distribution over the MTP logits, and that
    distribution is each draft's q: the first draft's q equals temperature/top-k applied to module 0's
    logits over the full context (recomputed on fresh pools). Greedy requests in the same batch keep
    argmax drafts; a seeded request's output is the same run to run."""
    params = [
        SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
    ]
    prompts = _prompts()[2:4]
    llm = _llm(ckpt, 2, max_num_batched_tokens=64)
    prop, seen = llm.engine.proposer, []
    original = prop.propose

    def spy(seqs, limits):
        drafts = original(seqs, limits)
        seen.extend((list(s.token_ids), s.params.greedy, d) for s, d in zip(seqs, drafts))
        return drafts

    prop.propose = spy
    outs = llm.generate(prompts, params, use_tqdm=False)
    again = _llm(ckpt, 2, max_num_batched_tokens=64).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in again]
    sampled = [(t, d) for t, greedy, d in seen if not greedy]
    assert all(not isinstance(d, Draft) for _, greedy, d in seen if greedy)
    assert len(sampled) >= 5 and all(isinstance(d, Draft) and d.probs is not None for _, d in sampled)
    model = llm.engine.model
    ids = prompts[0]["prompt_token_ids"] + outs[0].outputs[0].token_ids
    h = PagedKVHarness(model.cache_specs(), block_size=16, num_blocks=64)
    s = h.add_sequence()
    with torch.inference_mode():
        streams = model.forward(h.step({s: ids}), h.pools)
        batch = h.step({s: ids[1:]}, positions_from={s: 0})
        logits = model.mtp_compute_logits(0, model.mtp_forward(0, batch, streams[:-1], h.pools))
    ref = ReferenceSamplingOps()
    checked = 0
    for toks, d in sampled:
        if ids[: len(toks)] != toks:
            continue
        want = ref.probs(logits[len(toks) - 2][None], sampling_tensors([SimpleNamespace(params=params[0])]))
        torch.testing.assert_close(d.probs[0], want[0], rtol=0, atol=1e-5)
        assert 0 < float(d.probs[0].max()) < 1 and float(d.probs[0, d.token_ids[0]]) > 0
        checked += 1
    assert checked >= 3
    _no_leaks(llm)


@pytest.mark.parametrize(
    "k,device_plan", [(1, False), (3, False), (3, True)], ids=["k1", "k3", "k3_device_plan"]
)
@pytest.mark.parametrize("capture", [False, True], ids=["static", "replayed"])
def test_mtp_verify_and_draft_steps_run_static_and_replayed(
    ckpt, plain, monkeypatch, k, device_plan, capture
):
    """With MTP on, decode/verify steps (1 + k rows per sequence, short drafts padded) and the MTP catch-up
    and chained draft steps all run with static shapes, and replay captured graphs: the tap of the
    target's hidden states is a graph output, so speculative decoding no longer turns graphs off.
    ``device_plan``: the target's decode and verify steps build their slot plan inside the step."""
    llm = _llm(ckpt, k, max_num_batched_tokens=64, device_plan=device_plan)
    assert llm.engine.runner.device_plan is device_plan
    runner = llm.engine.runner
    counts = stand_in_capture(runner, monkeypatch) if capture else None
    runner.static_decode(8, capture=capture)
    seen: list[tuple] = []
    real_prepare = runner.prepare
    monkeypatch.setattr(runner, "prepare", lambda s: _record(real_prepare(s), seen))
    assert_same_outputs(plain, llm.generate(_prompts(), PARAMS, use_tqdm=False))
    verify_keys = {key for key in seen if key is not None and key[2] > 1}
    assert verify_keys, "no verify step ran static"
    assert llm.get_stats()["spec_num_accepted_tokens"] >= 0
    if capture:
        draft = [key for key in runner.graphs if key[0] == "draft"]
        target = [key for key in runner.graphs if key[0] != "draft"]
        assert draft and any(key[2] > 1 for key in target) and any(key[2] == 1 for key in target)
        assert counts["captures"] == len(runner.graphs) and counts["replays"] > counts["captures"]
        assert counts["replays"] == counts["runs"]  # the capturing run replays too (a capture only records)
    _no_leaks(llm)


def _record(batch, seen: list):
    seen.append(batch.graph_key)
    return batch
