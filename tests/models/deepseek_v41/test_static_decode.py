"""V4.1 decode steps with static shapes (what a platform captures as graphs) give the dynamic steps' tokens
and logprobs, on ``flash_mini`` (Engram, encoder and decoder layers, CSA2 candidate pool), float32,
unquantized KV, reference backend.

Static steps pad rows to a batch bucket and the candidate tables to a context bucket, and read their Engram
rows from the host tier *before* the step (``prepare_static``) into the plan, among the graph's inputs.
``replayed``: a stand-in for graph capture whose replay re-runs the captured closure over the captured
buffers, so every later step reaches the model only through the runner's input copies; Engram rows (or any
table) that the forward reads but the runner does not copy would replay a stale step and fail the test.
With DSpark on, verify steps (``q = k + 1`` rows a sequence) and the draft head's steps are static too."""

from __future__ import annotations

import random

import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.engine.model_runner import MAX_STATIC_ROWS_PER_SEQ
from tests.graph_standin import stand_in_capture
from tests.models.deepseek_v41.goldens import checkpoint
from tests.outputs import assert_same_outputs

VOCAB = 384


def _llm(**kw) -> LLM:
    return LLM(
        model=str(checkpoint("flash_mini")),
        dtype="float32",
        kv_cache_dtype="unquantized",
        max_num_batched_tokens=512,
        **kw,
    )


def _decode_heavy() -> tuple[list[dict], list[SamplingParams]]:
    """Requests that finish at different steps (the batch shrinks through buckets 8, 4, 2, 1) and cross the
    256-token context bucket while decoding."""
    rng = random.Random(3)
    lens, steps = (1, 17, 40, 250, 5, 64), (12, 3, 8, 10, 16, 5)
    prompts = [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in lens]
    params = [
        SamplingParams(max_tokens=m, temperature=0.0 if i % 2 else 0.8, seed=i, logprobs=1, ignore_eos=True)
        for i, m in enumerate(steps)
    ]
    return prompts, params


@pytest.fixture(scope="module")
def dynamic():
    prompts, params = _decode_heavy()
    return _llm().generate(prompts, params, use_tqdm=False)


def test_v41_static_decode_steps_match_dynamic_ones(dynamic, monkeypatch):
    prompts, params = _decode_heavy()
    llm = _llm()
    runner = llm.engine.runner
    assert llm.engine.model.hasher is not None  # the Engram path is exercised
    counts = stand_in_capture(runner, monkeypatch)
    runner.static_decode(8, capture=True)
    assert_same_outputs(dynamic, llm.generate(prompts, params, use_tqdm=False))
    assert counts["captures"] == len(runner.graphs)
    assert {key[0] for key in runner.graphs} == {1, 2, 4, 8}
    assert {key[1] for key in runner.graphs} == {256, 512}
    assert counts["replays"] >= 2 * counts["captures"]  # most steps replay a captured one
    assert counts["replays"] == counts["runs"]


def test_stale_engram_rows_would_fail_the_replayed_test(dynamic, monkeypatch):
    """The check above can fail: a plan that leaves its Engram rows out of the graph inputs replays the
    captured step's rows."""
    from deepinfer_core.models.deepseek_v41.model import StepPlan

    tensors = StepPlan.tensors
    monkeypatch.setattr(
        StepPlan, "tensors", lambda self: tensors(self)[: len(tensors(self)) - len(self.engram or [])]
    )
    prompts, params = _decode_heavy()
    llm = _llm()
    stand_in_capture(llm.engine.runner, monkeypatch)
    llm.engine.runner.static_decode(8, capture=True)
    with pytest.raises(AssertionError):
        assert_same_outputs(dynamic, llm.generate(prompts, params, use_tqdm=False))


@pytest.mark.parametrize("device_plan", [False, True], ids=["host_plan", "device_plan"])
def test_v41_static_verify_and_draft_steps_keep_dspark_greedy_output(monkeypatch, device_plan):
    """``device_plan``: the verify steps' plans built inside them (the Engram tables read in the step, as in
    the test below); the draft head's steps keep their host plans."""
    prompts = _decode_heavy()[0][1:]  # every prompt of 2+ tokens: the draft head's catch-up could be static
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=1, ignore_eos=True)
    spec = {"method": "dspark", "num_speculative_tokens": 3}
    plain = _llm().generate(prompts, params, use_tqdm=False)
    extra = {}
    if device_plan:
        from deepinfer_core.ops.reference.memory import ReferenceMemoryOps

        monkeypatch.setattr(ReferenceMemoryOps, "reads_host_memory", True)
        extra = {"engram_in_step": True, "device_plan": True}
    llm = _llm(speculative_config=spec, **extra)
    runner = llm.engine.runner
    assert runner.device_plan is device_plan
    counts = stand_in_capture(runner, monkeypatch)
    runner.static_decode(8, capture=True)
    built = []
    real_device = llm.engine.model.plan_on_device
    monkeypatch.setattr(
        llm.engine.model, "plan_on_device", lambda b, c: built.append(b.graph_key[-1]) or real_device(b, c)
    )
    assert_same_outputs(plain, llm.generate(prompts, params, use_tqdm=False))
    assert (4 in built) is device_plan  # the verify steps' plans were built inside them
    qs = {key[-1] for key in runner.graphs}
    assert 4 in qs  # verify steps of k + 1 rows a sequence ran static
    assert any(isinstance(key[0], str) for key in runner.graphs)  # and the draft head's steps
    # but not its catch-up over a whole prompt (up to 250 rows a sequence): that stays dynamic
    assert max(key[-1] for key in runner.graphs) <= MAX_STATIC_ROWS_PER_SEQ
    assert counts["replays"] == counts["runs"]


def test_v41_device_built_plans_equal_the_host_ones_and_keep_the_tokens(dynamic, monkeypatch):
    """``device_plan``: with the Engram tables read inside the step (the CPU platform made to declare that its
    device reads host memory in place, as CUDA does), a static step's plan is built inside it
    (``plan_on_device``: V4's tables, the Engram look-back, the decoder's window slots). Every replayed step's
    device-built tables equal the host plan of the same batch, the host builds none itself, and the tokens and
    logprobs are the dynamic steps'."""
    import torch

    from deepinfer_core.ops.reference.memory import ReferenceMemoryOps

    monkeypatch.setattr(ReferenceMemoryOps, "reads_host_memory", True)
    prompts, params = _decode_heavy()
    llm = _llm(engram_in_step=True, device_plan=True)
    runner, model = llm.engine.runner, llm.engine.model
    assert model.engram_in_step and model.decoder_start is not None and runner.device_plan
    counts = stand_in_capture(runner, monkeypatch)
    runner.static_decode(8, capture=True)
    real_plan, real_device = model.plan, model.plan_on_device
    compared = []

    def checked(batch, context_bucket):
        got = real_device(batch, context_bucket)
        want = real_plan(batch, context_bucket).to(torch.device("cpu"))
        assert len(got.tensors()) == len(want.tensors())
        for a, b in zip(got.tensors(), want.tensors(), strict=True):
            assert torch.equal(a, b)
        compared.append(batch.graph_key)
        return got

    def dynamic_only(batch, context_bucket=None):
        assert context_bucket is None, "a static step's plan was built on the host"
        return real_plan(batch, context_bucket)

    monkeypatch.setattr(model, "plan_on_device", checked)
    monkeypatch.setattr(model, "plan", dynamic_only)
    got = llm.generate(prompts, params, use_tqdm=False)
    monkeypatch.setattr(model, "plan", real_plan)
    assert_same_outputs(dynamic, got)
    assert len(compared) == counts["runs"] + counts["captures"] and counts["replays"] == counts["runs"] > 8
