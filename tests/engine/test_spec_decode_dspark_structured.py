"""DSpark with structured output on the tiny V4.1 checkpoint, with both grammar backends: greedy output with
DSpark equals the output without speculation, token for token, and is valid; with drafts that agree with the
target (the oracle of :mod:`.test_spec_decode_dspark`, wrong at two positions in thirteen) drafts are accepted
beyond the first position under the grammar, and rejected drafts are rolled back in it; a sampling request
whose drafts are sampled with their q also ends valid."""

from __future__ import annotations

import json
import re

import pytest

from deepinfer_core import SamplingParams, StructuredOutputsParams

from .test_spec_decode_dspark import OracleDSpark, _engine

pytest.importorskip("deepinfer_structured")

REGEX = r"[a-z]{2,6}( [a-z]{2,6}){2,4}\."
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "kind": {"enum": ["module", "class", "function"]},
    },
    "required": ["name", "kind"],
    "additionalProperties": False,
}
PROMPTS = ["hello world", "describe it as JSON:"]


def _params() -> list[SamplingParams]:
    rx = StructuredOutputsParams(regex=REGEX)
    js = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    return [
        SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=rx),
        SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=js),
        SamplingParams(temperature=0.8, seed=7, max_tokens=40, structured_outputs=js),
    ]


def _check_valid(outs) -> None:
    assert re.fullmatch(REGEX, outs[0].outputs[0].text), outs[0].outputs[0].text
    for o in outs[1:]:
        assert o.outputs[0].finish_reason == "stop", o.outputs[0].text
        obj = json.loads(o.outputs[0].text)
        assert re.fullmatch("[a-z]{1,8}", obj["name"]) and obj["kind"] in SCHEMA["properties"]["kind"]["enum"]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_dspark_with_structured_output_keeps_greedy_output_and_stays_valid(backend):
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    kw = dict(structured_outputs_backend=backend, max_num_batched_tokens=16)
    plain = _engine(**kw).generate(prompts, _params(), use_tqdm=False)
    _check_valid(plain)
    llm = _engine({"method": "dspark", "num_speculative_tokens": 5}, **kw)
    outs = llm.generate(prompts, _params(), use_tqdm=False)
    for a, b in zip(plain[:2], outs[:2]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    _check_valid(outs)
    assert llm.get_stats()["spec_num_draft_tokens"] > 0
    assert len(llm.engine.structured) == 0, "grammar state leaked"

    full = {tuple(o.prompt_token_ids): o.prompt_token_ids + o.outputs[0].token_ids for o in plain[:2]}
    oracle = {"oracle": lambda m, s, c: OracleDSpark(m, s["num_speculative_tokens"], full)}
    llm = _engine({"method": "oracle", "num_speculative_tokens": 5}, oracle, **kw)
    outs = llm.generate(prompts[:2], _params()[:2], use_tqdm=False)
    for a, b in zip(plain[:2], outs):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    st = llm.engine.spec_stats
    assert sum(st.accepted_per_position[1:]) > 0 and st.num_accepted_tokens < st.num_draft_tokens
    assert len(llm.engine.structured) == 0, "grammar state leaked"
