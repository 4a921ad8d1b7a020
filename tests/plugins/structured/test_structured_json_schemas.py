"""JSON schemas under a random-weight model: every output parses and validates, on each backend.

Strings carry length bounds or patterns and objects close with ``additionalProperties: false``:
random logits rarely pick a closing quote among 126k tokens, so free text would only test
``max_tokens``. Numbers cannot be bounded in length by a schema; under llguidance a random model
writes a few hundred fraction digits now and then, hence the generous ``max_tokens`` (the batch
shrinks to those few rows, so the tail is cheap). Each schema is sampled at temperature 1 with three seeds.
"""

from __future__ import annotations

import json
import re

import pytest

from .json_schemas import SCHEMAS, STRING
from .structured_sim import generate

jsonschema = pytest.importorskip("jsonschema")


SEEDS = (0, 1, 2)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_every_output_parses_and_validates_against_its_schema(make_manager, backend):
    manager = make_manager(backend)
    requests, seeds = {}, {}
    for name, schema in SCHEMAS.items():
        for seed in SEEDS:
            rid = f"{name}/{seed}"
            requests[rid] = {"json": schema, "disable_any_whitespace": True}
            seeds[rid] = 1000 * seed + len(seeds)
    outs = generate(manager, requests, seeds, max_tokens=2048)
    tok = manager.vocab.tokenizer
    failures = []
    for rid, g in outs.items():
        text = tok.decode(g.body)
        schema = SCHEMAS[rid.split("/")[0]]
        try:
            assert g.finish_reason == "stop", f"did not finish ({len(g.tokens)} tokens)"
            jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
            assert not re.search(r"\s", STRING.sub('""', text)), "whitespace outside strings"
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{rid}: {text!r}: {e}")
    assert not failures, "\n".join(failures)
    assert len(manager) == 0


def test_there_are_at_least_thirty_schemas():
    assert len(SCHEMAS) >= 30
