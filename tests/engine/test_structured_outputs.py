"""Structured outputs through the engine: the grammar bitmask is applied to every constrained row, the
grammar's stop ends the request, and unconstrained requests in the same batch are untouched."""

from __future__ import annotations

import json
import re

import pytest

from deepinfer_core import SamplingParams, StructuredOutputsParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine

from .conftest import toy_backends, v4_tokenizer_and_grammars
from .toy_model import ToyHybridLM


@pytest.fixture(scope="module")
def llm():
    tok, backends = v4_tokenizer_and_grammars()
    vocab = 129280  # the V4 tokenizer's logits width
    config = load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=256)
    model = ToyHybridLM(vocab_size=vocab, max_pos=256)
    model.eos_token_ids = [tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")]
    assert model.eos_token_ids[0] is not None
    return LLM.from_engine(LLMEngine(config, model, toy_backends(), tok, backends))


def test_regex_choice_and_json_constraints_hold_and_end_with_stop(llm):
    prompt = {"prompt_token_ids": [0, 100, 200, 300]}
    cases = [
        StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}"),
        StructuredOutputsParams(choice=["alpha", "beta", "gamma"]),
        StructuredOutputsParams(
            json={
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            },
            disable_any_whitespace=True,
        ),
    ]
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=60, structured_outputs=so)
        for i, so in enumerate(cases)
    ]
    free = SamplingParams(temperature=1.0, seed=9, max_tokens=8, ignore_eos=True)
    outs = llm.generate([prompt] * 4, [*params, free], use_tqdm=False)
    texts = [o.outputs[0].text for o in outs]
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", texts[0]), texts[0]
    assert texts[1] in ("alpha", "beta", "gamma")
    assert isinstance(json.loads(texts[2])["ok"], bool)
    for o in outs[:3]:
        assert o.outputs[0].finish_reason == "stop"
    alone = llm.generate([prompt], free, use_tqdm=False)[0]
    assert outs[3].outputs[0].token_ids == alone.outputs[0].token_ids
    assert len(llm.engine.structured) == 0, "grammar state leaked"


def test_a_bad_constraint_is_refused_before_scheduling(llm):
    with pytest.raises(ValueError, match="structured_outputs"):
        llm.generate(
            [{"prompt_token_ids": [5]}],
            SamplingParams(structured_outputs=StructuredOutputsParams(regex="(")),
            use_tqdm=False,
        )
    assert not llm.engine.requests


def test_grammar_that_must_stop_wins_over_min_tokens(llm):
    """min_tokens bans EOS, but a finished choice grammar allows only EOS: the request still ends validly."""
    so = StructuredOutputsParams(choice=["ab"])
    [out] = llm.generate(
        [{"prompt_token_ids": [0, 7, 8]}],
        SamplingParams(temperature=0.0, max_tokens=20, min_tokens=5, structured_outputs=so),
        use_tqdm=False,
    )
    assert out.outputs[0].text == "ab" and out.outputs[0].finish_reason == "stop"
