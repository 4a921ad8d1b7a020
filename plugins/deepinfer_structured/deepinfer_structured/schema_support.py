"""JSON-schema keywords a backend would accept but not enforce.

xgrammar 0.2 compiles these without complaint and then lets through text that violates them, so the
xgrammar backend rejects a schema that uses them (``auto`` then tries llguidance). The walk follows
the schema's structure: property names and ``enum``/``const`` data are never taken for keywords.
"""

from __future__ import annotations

from typing import Any

XGRAMMAR_UNENFORCED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas")

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "additionalItems",
)


def unenforced_keywords(schema: Any, keywords: tuple[str, ...] = XGRAMMAR_UNENFORCED) -> list[str]:
    """JSON pointers (``#/properties/a/uniqueItems``) of keywords in ``schema`` that xgrammar ignores."""
    found: list[str] = []
    _walk(schema, "#", keywords, found)
    return found


def _walk(node: Any, path: str, keywords: tuple[str, ...], found: list[str]) -> None:
    if not isinstance(node, dict):
        return
    for key in keywords:
        if key in node:
            found.append(f"{path}/{key}")
    if node.get("uniqueItems") is True:
        found.append(f"{path}/uniqueItems")
    if "multipleOf" in node and not (node.get("type") == "integer" and _is_int(node["multipleOf"])):
        found.append(f"{path}/multipleOf")
    for key in _SCHEMA_MAPS:
        for name, sub in (node.get(key) or {}).items() if isinstance(node.get(key), dict) else ():
            _walk(sub, f"{path}/{key}/{name}", keywords, found)
    for key in _SCHEMA_LISTS:
        for i, sub in enumerate(node.get(key) or ()) if isinstance(node.get(key), list) else ():
            _walk(sub, f"{path}/{key}/{i}", keywords, found)
    for key in _SCHEMA_VALUES:
        _walk(node.get(key), f"{path}/{key}", keywords, found)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
