"""One bad request fails alone: it ends with ``finish_reason="error"`` and an error naming it, its blocks
and grammar state are freed, every other request in the same call completes exactly as it would alone,
and the engine keeps working. A call's requests are queued all or none."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core import SamplingParams, StructuredOutputsParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.structured.backend import CompiledGrammar, GrammarBackend

from .conftest import make_toy_llm, toy_backends, v4_tokenizer_and_grammars
from .toy_model import ToyHybridLM

POISON = 77


def assert_clean(llm: LLM) -> None:
    eng = llm.engine
    assert not eng.requests and not eng.scheduler.running and not eng.scheduler.waiting
    assert len(eng.structured) == 0, "grammar state leaked"
    for group, pool in eng.kv.pools.items():
        assert pool.num_in_use == 0, f"{group}: {pool.num_in_use} blocks leaked"


def _alone(llm: LLM, prompt, params: SamplingParams) -> list[int]:
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids


class _PoisonedToy(ToyHybridLM):
    """Raises inside the forward pass whenever a batch holds token ``POISON`` (a bad table entry, say)."""

    def forward(self, batch, kv):
        if bool((batch.input_ids == POISON).any()):
            raise IndexError(f"index {POISON} is out of bounds for the expert table")
        return super().forward(batch, kv)


def test_a_step_that_raises_for_one_request_fails_that_request_alone():
    config = load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=256)
    llm = LLM.from_engine(LLMEngine(config, _PoisonedToy(), toy_backends()))
    good = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9] * 13}, {"prompt_token_ids": [4, 3]}]
    bad = {"prompt_token_ids": [5, 6, POISON, 8]}
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)
    solo = [_alone(llm, p, params) for p in good]
    outs = llm.generate([good[0], bad, good[1], good[2]], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in (outs[0], outs[2], outs[3])] == solo
    assert all(
        o.outputs[0].finish_reason == "length" and o.error is None for o in (outs[0], outs[2], outs[3])
    )
    failed = outs[1]
    assert failed.outputs[0].finish_reason == "error"
    assert failed.error.startswith(f"request {failed.request_id!r} failed")
    assert "IndexError" in failed.error and "expert table" in failed.error
    assert_clean(llm)
    assert llm.generate(good[:1], params, use_tqdm=False)[0].outputs[0].token_ids == solo[0]


def test_eos_outside_the_vocabulary_with_min_tokens_fails_only_the_requests_that_need_it():
    llm = make_toy_llm()
    llm.engine.model.eos_token_ids = [500]  # a vocabulary of 96: masking it for min_tokens raises
    llm.engine.sampler.eos = [500]
    prompt = {"prompt_token_ids": [5, 6, 7]}
    plain = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    needy = SamplingParams(temperature=0.0, max_tokens=6, min_tokens=3)
    solo = _alone(llm, prompt, plain)
    outs = llm.generate([prompt, prompt, prompt], [plain, needy, plain], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == solo == outs[2].outputs[0].token_ids
    assert outs[1].outputs[0].finish_reason == "error" and "IndexError" in outs[1].error
    assert_clean(llm)


@pytest.fixture(scope="module")
def grammar_llms():
    tok, backends = v4_tokenizer_and_grammars()
    if "llguidance" not in backends:
        pytest.skip("llguidance is not installed")
    eos = tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    out = {}
    for name in ("xgrammar", "llguidance"):
        config = load_config(
            environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=256, structured_outputs_backend=name
        )
        model = ToyHybridLM(vocab_size=129280, max_pos=256)
        model.eos_token_ids = [eos]
        out[name] = LLM.from_engine(LLMEngine(config, model, toy_backends(), tok, backends))
    return out


FAILING_GRAMMARS = [
    ("xgrammar", StructuredOutputsParams(regex=r"[^\s\S]")),
    ("llguidance", StructuredOutputsParams(regex=r"[^\s\S]")),
    ("llguidance", StructuredOutputsParams(json={"$ref": "#"})),
]


@pytest.mark.parametrize("backend,so", FAILING_GRAMMARS, ids=["xg-empty", "llg-empty", "llg-self-ref"])
def test_a_grammar_that_fails_mid_generation_fails_its_request_alone(grammar_llms, backend, so):
    llm = grammar_llms[backend]
    prompts = [{"prompt_token_ids": [0, 100 + i, 200, 300]} for i in range(3)]
    free = SamplingParams(temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    regex = SamplingParams(
        temperature=1.0, seed=8, max_tokens=20, structured_outputs=StructuredOutputsParams(regex=r"[0-9]{4}")
    )
    bad = SamplingParams(temperature=1.0, seed=9, max_tokens=20, structured_outputs=so)
    solo = [_alone(llm, prompts[0], free), _alone(llm, prompts[2], regex)]
    outs = llm.generate(prompts, [free, bad, regex], use_tqdm=False)
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == solo
    assert outs[2].outputs[0].finish_reason == "stop" and len(outs[2].outputs[0].text) == 4
    assert outs[1].outputs[0].finish_reason == "error"
    assert outs[1].error.startswith(f"request {outs[1].request_id!r} failed")
    assert_clean(llm)
    again = llm.generate(prompts[:1], free, use_tqdm=False)  # the engine is not poisoned
    assert again[0].outputs[0].token_ids == solo[0]


class _RefusingBackend(GrammarBackend):
    """Compiles anything, but cannot start a matcher for the regex "refuse" (a backend failing late)."""

    name = "refusing"

    def _compile(self, constraint):
        return CompiledGrammar(constraint, self.name, None)

    def matcher(self, grammar):
        if grammar.constraint.spec == "refuse":
            raise ValueError("this backend cannot start that grammar")
        raise AssertionError("not reached in this test")


def test_requests_of_a_call_are_queued_all_or_none(grammar_llms):
    tok = grammar_llms["xgrammar"].get_tokenizer()
    llm = make_toy_llm(vocab_size=129280, max_pos=256, max_model_len=256)
    eng = llm.engine
    eng.structured._factories = {"refusing": _RefusingBackend}
    eng.structured.backend_name = "refusing"
    eng.structured._tokenizer = eng.inputs.tokenizer = eng.outputs.tokenizer = tok
    ok = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    refused = SamplingParams(structured_outputs=StructuredOutputsParams(regex="refuse"))
    prompts = [{"prompt_token_ids": [5, 6, 7]}] * 3
    with pytest.raises(ValueError, match="cannot start that grammar"):
        llm.generate(prompts, [ok, ok, refused], use_tqdm=False)
    assert_clean(llm)
    assert eng.get_stats()["num_requests"] == 0
    outs = llm.generate(prompts[:1], ok, use_tqdm=False)  # nothing from the failed call runs or leaks in
    assert [o.request_id for o in outs] == ["3"] and len(outs[0].outputs[0].token_ids) == 4


def test_a_bad_sibling_sample_fails_the_request_but_not_the_batch():
    """n > 1 samples of a poisoned request all end with the error; the rest of the batch is unaffected."""
    config = load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=256)
    llm = LLM.from_engine(LLMEngine(config, _PoisonedToy(), toy_backends()))
    params = SamplingParams(temperature=1.0, seed=1, n=3, max_tokens=5, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": [POISON, 5]}, {"prompt_token_ids": [5, 6]}], params, use_tqdm=False
    )
    assert {c.finish_reason for c in outs[0].outputs} == {"error"}
    assert [c.finish_reason for c in outs[1].outputs] == ["length"] * 3
    assert torch.tensor([len(c.token_ids) for c in outs[1].outputs]).eq(5).all()
    assert_clean(llm)
