"""MTP (a model-based proposer) with structured output, on the demo checkpoint (its trained MTP head drafts
real, often accepted tokens) with both grammar backends: greedy output equals the output without
speculation, token for token, and is valid; a sampling request, whose MTP drafts are sampled with their q,
also ends valid. Draft rows get the grammar mask after the earlier drafts, and a rejected draft is rolled
back in the grammar, so drafts the grammar forbids are simply rejected."""

from __future__ import annotations

import json
import re

import pytest

from deepinfer_core import LLM, SamplingParams, StructuredOutputsParams
from deepinfer_core.demo import demo_checkpoint

pytest.importorskip("deepinfer_structured")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z_]{1,10}$"},
        "kind": {"enum": ["module", "class", "function"]},
        "args": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 3},
    },
    "required": ["name", "kind", "args"],
    "additionalProperties": False,
}
REGEX = r"def [a-z_]{1,12}\(self(, [a-z_]{1,8}){0,2}\):\n        return self\.[a-z_]{1,12}\n"
PROMPTS = ["import os\n\n\nclass Walker:\n    def __init__(self, root):\n        self.root = root\n\n    ",
           "# describe the function as JSON\ndef join(a, b):\n    return a + b\n"]  # fmt: skip


def _params() -> list[SamplingParams]:
    rx = StructuredOutputsParams(regex=REGEX)
    js = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    return [
        SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=rx),
        SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=js),
        SamplingParams(temperature=0.8, seed=7, max_tokens=64, structured_outputs=js),
    ]


def _run(backend: str, spec: dict | None):
    llm = LLM(
        str(demo_checkpoint("demo-v4")),
        kv_cache_memory_bytes=32 << 20,
        structured_outputs_backend=backend,
        speculative_config=spec,
    )
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    return llm.generate(prompts, _params(), use_tqdm=False), llm


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_mtp_with_structured_output_keeps_greedy_output_and_stays_valid(backend):
    plain, _ = _run(backend, None)
    outs, llm = _run(backend, {"method": "mtp", "num_speculative_tokens": 3})
    for a, b in zip(plain[:2], outs[:2]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert re.fullmatch(REGEX, outs[0].outputs[0].text), outs[0].outputs[0].text
    for o in outs[1:]:
        assert o.outputs[0].finish_reason == "stop", o.outputs[0].text
        obj = json.loads(o.outputs[0].text)
        assert (
            re.fullmatch("[a-z_]{1,10}", obj["name"]) and obj["kind"] in SCHEMA["properties"]["kind"]["enum"]
        )
    stats = llm.get_stats()
    assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"]
    assert stats["spec_acceptance_per_position"][1] > 0  # drafts accepted beyond the first position
    assert len(llm.engine.structured) == 0, "grammar state leaked"
