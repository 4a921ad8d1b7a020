"""The constraint a request puts on its output, normalised into one hashable value.

The engine hands over ``SamplingParams.structured_outputs``; anything with the attributes ``json``,
``json_object``, ``regex``, ``choice``, ``grammar`` and ``disable_any_whitespace`` (or a dict with those
keys) works, so this module does not depend on the engine's parameter classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredConstraint:
    """One constraint. ``spec`` is canonical text, so equal constraints have equal keys:

    - ``json``: the schema as compact JSON (key order kept: it fixes the order of generated properties);
    - ``json_object``: ``""``;
    - ``regex`` / ``grammar``: the text as given;
    - ``choice``: the choices as a JSON list.
    """

    kind: str
    spec: str
    disable_any_whitespace: bool = False

    @property
    def key(self) -> tuple[str, str, bool]:
        return (self.kind, self.spec, self.disable_any_whitespace)

    def schema(self) -> Any:
        """The JSON schema of a ``json`` or ``json_object`` constraint."""
        if self.kind == "json_object":
            return {"type": "object"}
        if self.kind != "json":
            raise TypeError(f"a {self.kind} constraint has no JSON schema")
        return json.loads(self.spec)

    def choices(self) -> list[str]:
        if self.kind != "choice":
            raise TypeError(f"a {self.kind} constraint has no choices")
        return json.loads(self.spec)

    def describe(self, limit: int = 80) -> str:
        text = self.spec if len(self.spec) <= limit else self.spec[: limit - 3] + "..."
        return f"{self.kind}={text!r}" if self.spec else self.kind


def constraint_from_params(params: Any) -> StructuredConstraint:
    """Normalise ``params`` (a :class:`StructuredConstraint`, a mapping, or an object with the
    ``StructuredOutputsParams`` attributes) and validate what can be checked without a backend.

    :raises ValueError: not exactly one constraint, a schema that is not JSON, an empty or
        non-string regex or grammar, an empty choice list or a choice that is not a non-empty string.
    """
    if isinstance(params, StructuredConstraint):
        return params
    get = (
        params.get
        if isinstance(params, Mapping)
        else (lambda name, default=None: getattr(params, name, default))
    )
    given = [k for k in KINDS if get(k) is not None and get(k) is not False]
    if len(given) != 1:
        raise ValueError(
            f"structured_outputs: exactly one of {', '.join(KINDS)} must be set; got {given or 'none'}"
        )
    kind = given[0]
    ws = get("disable_any_whitespace", False)
    if not isinstance(ws, bool):
        raise ValueError(f"structured_outputs.disable_any_whitespace must be a bool; got {ws!r}")
    return StructuredConstraint(kind, _canonical(kind, get(kind)), ws)


def _canonical(kind: str, value: Any) -> str:
    if kind == "json":
        return _schema_text(value)
    if kind == "json_object":
        if value is not True:
            raise ValueError(f"structured_outputs.json_object must be True; got {value!r}")
        return ""
    if kind == "choice":
        return _choice_text(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"structured_outputs.{kind} must be a non-empty string; got {value!r}")
    return value


def _schema_text(value: Any) -> str:
    if hasattr(value, "model_json_schema"):  # a pydantic model class
        value = value.model_json_schema()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
    if not isinstance(value, (dict, bool)):
        raise ValueError(
            f"structured_outputs.json must be a JSON schema (an object or a boolean); got {type(value).__name__}"
        )
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"structured_outputs.json cannot be serialised as JSON: {e}") from None


def _choice_text(value: Any) -> str:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"structured_outputs.choice must be a list of strings; got {value!r}")
    if not value:
        raise ValueError("structured_outputs.choice must not be empty: give at least one choice")
    bad = [c for c in value if not isinstance(c, str) or c == ""]
    if bad:
        raise ValueError(f"structured_outputs.choice entries must be non-empty strings; got {bad[0]!r}")
    return json.dumps(list(value), ensure_ascii=False)
