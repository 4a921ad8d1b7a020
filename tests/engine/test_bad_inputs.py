"""Every bad input raises a ValueError naming the parameter, before anything is scheduled; afterwards the
LLM still works and holds no KV block."""

from __future__ import annotations

import math

import pytest

from deepinfer_core import SamplingParams, StructuredOutputsParams
from deepinfer_core.config import ConfigError

from .conftest import make_toy_llm

OK = {"prompt_token_ids": [5, 6, 7]}

SAMPLING_CASES = [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=1.1), "min_p"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens"),
    (dict(n=0), "n"),
    (dict(n=2, temperature=0.0), "n"),
    (dict(stop=[""]), "stop"),
    (dict(stop=""), "stop"),
    (dict(logprobs=21), "logprobs"),
    (dict(prompt_logprobs=21), "prompt_logprobs"),
    (dict(logit_bias={3: 200.0}), "logit_bias"),
    (dict(bogus=1), "bogus"),
    (dict(seed=1.5), "seed"),
]


@pytest.mark.parametrize(
    "kw,name", SAMPLING_CASES, ids=[n + str(i) for i, (_, n) in enumerate(SAMPLING_CASES)]
)
def test_bad_sampling_params_name_the_parameter_and_value(kw, name):
    with pytest.raises(ValueError) as e:
        SamplingParams(**kw)
    msg = str(e.value)
    value = next(iter(kw.values()))
    value = (
        value[0]
        if isinstance(value, list)
        else next(iter(value.values()))
        if isinstance(value, dict)
        else value
    )
    assert name in msg and repr(value) in msg


@pytest.fixture(scope="module")
def llm():
    return make_toy_llm(max_model_len=64)


ENGINE_CASES = [
    ([{"prompt_token_ids": []}], None, "prompt_token_ids"),
    ([""], None, "prompts[1]"),
    ([{"prompt_token_ids": [5, 96]}], None, "96"),
    ([{"prompt_token_ids": [5, -1]}], None, "-1"),
    ([{"prompt_token_ids": [5] * 64}], None, "max_model_len"),
    ([OK], SamplingParams(max_tokens=62), "max_tokens"),
    ([OK], SamplingParams(stop_token_ids=[96]), "stop_token_ids"),
    ([OK], SamplingParams(logit_bias={500: 1.0}), "logit_bias"),
    ([OK, OK], [SamplingParams()], "sampling_params"),
    (
        [OK],
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")),
        "deepinfer-structured plugin",
    ),
    ([42], None, "prompts[1]"),
]


@pytest.mark.parametrize("prompts,params,needle", ENGINE_CASES, ids=[c[2] for c in ENGINE_CASES])
def test_bad_requests_fail_before_scheduling_and_leave_the_llm_usable(llm, prompts, params, needle):
    before = llm.get_stats()["num_requests"]
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        llm.generate([OK, *prompts] if len(prompts) == 1 else prompts, params, use_tqdm=False)
    assert llm.get_stats()["num_requests"] == before, "a request was scheduled before validation finished"
    assert all(p.num_in_use == 0 for p in llm.engine.kv.pools.values())
    out = llm.generate([OK], SamplingParams(max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) >= 1


def test_structured_outputs_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    assert StructuredOutputsParams(json={"type": "object"}).kind == "json"


def test_unknown_llm_keyword_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="max_num_seq"):
        make_toy_llm(max_num_seq=4)


def test_a_transient_model_error_mid_generation_is_retried_and_changes_nothing():
    llm = make_toy_llm()
    prompts = [{"prompt_token_ids": list(range(2 + i, 90))} for i in range(3)]
    params = SamplingParams(max_tokens=20, temperature=0.7, seed=5)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    model = llm.engine.model
    real = model.forward
    calls = {"n": 0}

    def flaky(batch, kv):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device fell over")
        return real(batch, kv)

    model.forward = flaky
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert calls["n"] > 3 and [o.outputs[0].token_ids for o in outs] == expected
    assert all(o.error is None for o in outs)


def test_a_persistent_model_error_fails_every_request_alone_and_the_llm_still_works():
    llm = make_toy_llm()
    model = llm.engine.model
    real = model.forward
    broken = {"on": True}

    def failing(batch, kv):
        if broken["on"]:
            raise RuntimeError("device fell over")
        return real(batch, kv)

    model.forward = failing
    outs = llm.generate(
        [{"prompt_token_ids": list(range(2, 90))}] * 3, SamplingParams(max_tokens=20), use_tqdm=False
    )
    assert [o.outputs[0].finish_reason for o in outs] == ["error"] * 3
    assert all("device fell over" in o.error for o in outs)
    assert not llm.engine.requests and not llm.engine.scheduler.running and not llm.engine.scheduler.waiting
    assert all(p.num_in_use == 0 for p in llm.engine.kv.pools.values())
    broken["on"] = False
    assert llm.generate([OK], SamplingParams(max_tokens=2), use_tqdm=False)[0].finished
