"""Random mixes of good and bad requests, with and without grammars, thrown at one engine.

Bad requests come in two kinds: refused at submission (bad parameters, a grammar that does not compile),
which refuses the whole call and queues nothing; and failing while they run (a grammar with an empty
language, a token that makes the forward pass raise), which end alone with ``finish_reason="error"``.
Every good request completes with exactly the output it has alone, and at the end of every call the KV
pools and the grammar state are empty."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_core import SamplingParams, StructuredOutputsParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine

from .conftest import toy_backends, v4_tokenizer_and_grammars
from .test_request_isolation import POISON, _PoisonedToy, assert_clean

GRAMMARS = {
    "digits": StructuredOutputsParams(regex=r"[0-9]{2,5}"),
    "choice": StructuredOutputsParams(choice=["yes", "no", "maybe"]),
    "json": StructuredOutputsParams(
        json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        disable_any_whitespace=True,
    ),
}

good_st = st.fixed_dictionaries(
    {
        "kind": st.just("good"),
        "prompt": st.lists(st.integers(2, 300).filter(lambda t: t != POISON), min_size=1, max_size=20),
        "temperature": st.sampled_from([0.0, 0.8]),
        "seed": st.integers(0, 3),
        "max_tokens": st.integers(1, 8),
        "grammar": st.sampled_from([None, None, "digits", "choice", "json"]),
    }
)
runtime_bad_st = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["empty-grammar", "poison"]),
        "prompt": st.lists(st.integers(2, 300), min_size=1, max_size=10),
    }
)
submit_bad_st = st.fixed_dictionaries(
    {"kind": st.sampled_from(["bad-token", "bad-grammar", "too-long"]), "prompt": st.just([5, 6])}
)


@pytest.fixture(scope="module")
def fuzz_llm():
    tok, backends = v4_tokenizer_and_grammars()
    config = load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=128)
    model = _PoisonedToy(vocab_size=129280, max_pos=128)
    model.eos_token_ids = [tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")]
    return LLM.from_engine(LLMEngine(config, model, toy_backends(), tok, backends))


def _request(r: dict) -> tuple[dict, SamplingParams]:
    kind, prompt = r["kind"], list(r["prompt"])
    if kind == "good":
        so = GRAMMARS[r["grammar"]] if r["grammar"] else None
        params = SamplingParams(
            temperature=r["temperature"], seed=r["seed"], max_tokens=r["max_tokens"], structured_outputs=so
        )
        return {"prompt_token_ids": prompt}, params
    if kind == "empty-grammar":
        return {"prompt_token_ids": prompt}, SamplingParams(
            structured_outputs=StructuredOutputsParams(regex=r"[^\s\S]")
        )
    if kind == "poison":
        return {"prompt_token_ids": prompt + [POISON]}, SamplingParams(max_tokens=4)
    if kind == "bad-token":
        return {"prompt_token_ids": [5, 10**9]}, SamplingParams()
    if kind == "bad-grammar":
        return {"prompt_token_ids": prompt}, SamplingParams(
            structured_outputs=StructuredOutputsParams(regex="(unclosed")
        )
    return {"prompt_token_ids": [7] * 200}, SamplingParams()  # longer than max_model_len


_alone_cache: dict = {}


def _alone(llm: LLM, prompt: dict, params: SamplingParams) -> list[int]:
    key = (tuple(prompt["prompt_token_ids"]), repr(params))
    if key not in _alone_cache:
        _alone_cache[key] = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    return _alone_cache[key]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(
        st.lists(st.one_of(good_st, good_st, runtime_bad_st, submit_bad_st), min_size=1, max_size=6),
        min_size=1,
        max_size=3,
    )
)
def test_good_requests_complete_as_alone_whatever_the_bad_ones_do(fuzz_llm, calls):
    llm = fuzz_llm
    for call in calls:
        reqs = [_request(r) for r in call]
        refused = any(r["kind"] in ("bad-token", "bad-grammar", "too-long") for r in call)
        if refused:
            with pytest.raises(ValueError):
                llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
            assert_clean(llm)
            continue
        outs = llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
        assert_clean(llm)
        for r, (p, sp), out in zip(call, reqs, outs, strict=True):
            if r["kind"] == "good":
                assert out.error is None, out.error
                assert out.outputs[0].token_ids == _alone(llm, p, sp)
            else:
                assert out.outputs[0].finish_reason == "error" and out.error
