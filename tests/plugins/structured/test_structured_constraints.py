"""Constraint normalisation: one hashable value per constraint, and clear errors for malformed ones."""

from __future__ import annotations

import pytest

from deepinfer_core.structured import StructuredConstraint, constraint_from_params


class Params:
    def __init__(self, **kw):
        for k in ("json", "json_object", "regex", "choice", "grammar"):
            setattr(self, k, kw.get(k))
        self.disable_any_whitespace = kw.get("disable_any_whitespace", False)


def test_dict_object_and_engine_params_normalise_to_the_same_key():
    from deepinfer_core.sampling_params import StructuredOutputsParams

    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    forms = [
        {"json": schema},
        {"json": '{"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}'},
        Params(json=schema),
        StructuredOutputsParams(json=schema),
    ]
    keys = {constraint_from_params(f).key for f in forms}
    assert len(keys) == 1
    c = constraint_from_params(forms[0])
    assert c.kind == "json" and list(c.schema()["properties"]) == ["b", "a"]  # property order is kept


def test_whitespace_flag_and_kind_are_part_of_the_key():
    a = constraint_from_params({"json": {"type": "integer"}})
    b = constraint_from_params({"json": {"type": "integer"}, "disable_any_whitespace": True})
    c = constraint_from_params({"regex": '{"type":"integer"}'})
    assert len({a.key, b.key, c.key}) == 3


def test_each_kind_normalises():
    assert constraint_from_params({"json_object": True}).schema() == {"type": "object"}
    assert constraint_from_params({"regex": "[a-z]+"}).spec == "[a-z]+"
    assert constraint_from_params({"choice": ["x", "ü"]}).choices() == ["x", "ü"]
    assert constraint_from_params({"grammar": "start: 'a'"}).kind == "grammar"
    same = StructuredConstraint("regex", "a")
    assert constraint_from_params(same) is same


@pytest.mark.parametrize(
    "params, message",
    [
        ({}, "exactly one of json, json_object, regex, choice, grammar must be set; got none"),
        ({"json_object": False}, "got none"),
        ({"regex": "a", "choice": ["a"]}, "exactly one"),
        ({"choice": []}, "choice must not be empty"),
        ({"choice": ["a", 3]}, "entries must be non-empty strings"),
        ({"choice": ["a", ""]}, "entries must be non-empty strings"),
        ({"choice": "abc"}, "must be a list of strings"),
        ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
        ({"json": "[1, 2]"}, "must be a JSON schema (an object or a boolean)"),
        ({"json": 3}, "must be a JSON schema"),
        ({"regex": ""}, "regex must be a non-empty string"),
        ({"grammar": "   "}, "grammar must be a non-empty string"),
        ({"regex": 5}, "regex must be a non-empty string"),
        ({"json_object": "yes"}, "json_object must be True"),
        ({"regex": "a", "disable_any_whitespace": "no"}, "disable_any_whitespace must be a bool"),
    ],
)
def test_malformed_constraints_raise_value_error(params, message):
    with pytest.raises(ValueError) as e:
        constraint_from_params(params)
    assert message in str(e.value)
