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

from .structured_sim import generate

jsonschema = pytest.importorskip("jsonschema")


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


INT = {"type": "integer", "minimum": -50, "maximum": 50}
SHORT = {"type": "string", "maxLength": 6}
POINT = obj(
    {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "y": {"type": "integer", "minimum": -9, "maximum": 9},
    }
)

SCHEMAS = {
    "int_range": INT,
    "bool": {"type": "boolean"},
    "null": {"type": "null"},
    "enum_str": {"enum": ["red", "green", "blue"]},
    "enum_mixed": {"enum": ["a", 1, None, True]},
    "const_obj": {"const": {"k": [1, 2]}},
    "short_string": SHORT,
    "string_min_max": {"type": "string", "minLength": 3, "maxLength": 6},
    "string_pattern": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
    "email_like_pattern": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
    "format_date": {"type": "string", "format": "date"},
    "format_uuid": {"type": "string", "format": "uuid"},
    "nullable_int": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
    "int_multiple_of": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
    "person": obj({"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "number_fields": obj(
        {
            "p": {"type": "number", "minimum": 0, "maximum": 1},
            "t": {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 2.5},
            "unit": {"enum": ["m", "s"]},
        }
    ),
    "optional_fields": obj({"a": INT, "b": SHORT, "c": {"type": "boolean"}}, required=[]),
    "some_optional": obj({"id": INT, "note": SHORT, "flag": {"type": "boolean"}}, required=["id"]),
    "nested_objects": obj(
        {
            "user": obj(
                {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
                }
            )
        }
    ),
    "deep_nesting": obj({"a": obj({"b": obj({"c": obj({"d": {"type": "boolean"}})})})}),
    "int_array_bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2,
        "maxItems": 5,
    },
    "string_array": {
        "type": "array",
        "items": {"type": "string", "maxLength": 3},
        "minItems": 1,
        "maxItems": 4,
    },
    "object_array": {"type": "array", "items": obj({"k": {"enum": ["x", "y"]}, "v": INT}), "maxItems": 3},
    "tuple_prefix_items": {
        "type": "array",
        "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 10}],
        "items": False,
        "minItems": 2,
    },
    "any_of_scalars": {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": 10},
            {"type": "string", "maxLength": 4},
            {"type": "null"},
        ]
    },
    "any_of_objects": {
        "anyOf": [
            obj({"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 0, "maximum": 9}}),
            obj({"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 0, "maximum": 9}}),
        ]
    },
    "defs_ref": {"$defs": {"pt": POINT}, **obj({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    "recursive_tree": {
        "$defs": {
            "node": obj(
                {
                    "v": {"type": "integer", "minimum": 0, "maximum": 9},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                required=["v"],
            )
        },
        "$ref": "#/$defs/node",
    },
    "enum_int": {"enum": [1, 2, 3, 5, 8]},
    "array_of_arrays": {
        "type": "array",
        "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "minItems": 1,
        "maxItems": 3,
    },
    "pattern_properties": {
        "type": "object",
        "patternProperties": {"^k[0-9]$": {"type": "integer", "minimum": 0, "maximum": 9}},
        "additionalProperties": False,
        "maxProperties": 3,
    },
    "mixed_record": obj(
        {
            "id": {"type": "string", "pattern": "^[0-9a-f]{4}$"},
            "ok": {"type": "boolean"},
            "score": {"type": "number", "minimum": -1, "maximum": 1},
            "missing": {"type": "null"},
            "level": {"enum": ["low", "mid", "high"]},
        }
    ),
}
SEEDS = (0, 1, 2)
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


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
