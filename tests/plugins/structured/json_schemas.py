"""The JSON-schema suite shared by the grammar-level and the engine-level structured-output tests.

Strings carry length bounds or patterns and objects close with ``additionalProperties: false``: random
logits rarely pick a closing quote among 126k tokens, so free text would only test ``max_tokens``.
"""

from __future__ import annotations

import re


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
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
