"""DSML, the markup DeepSeek-V4 uses for tool calls, in both directions.

A tool-call block, as the model writes it (and as we render past calls)::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">Beijing</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

``string="true"`` marks a raw string value, written as is (no quoting or escaping);
``string="false"`` marks any other JSON value (number, bool, null, array, object), written as compact
JSON. One ``invoke`` per call, parameters one per line, in argument order. In an assistant turn the
block follows the text content after a blank line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.tokens import (
    DSML,
    INVOKE_END,
    PARAMETER_END,
    TOOL_CALLS_END,
    TOOL_CALLS_START,
    TOOLS_SECTION,
)
from deepinfer_core.chat.validate import ToolCall


def _to_json(value: Any) -> str:
    """JSON the way the reference writes it: ``", "``/``": "`` separators, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)


def render_tools_section(functions: list[dict[str, Any]]) -> Prompt:
    """The tools part of the system prompt: instructions plus one JSON schema per line (content)."""
    head, tail = TOOLS_SECTION.split("{schemas}")
    out = Prompt().own(head)
    for k, fn in enumerate(functions):
        out.own("\n" if k else "").content(_to_json(fn))
    return out.own(tail)


def render_tool_calls(calls: Iterable[ToolCall]) -> Prompt:
    """A DSML block for an assistant turn's tool calls (empty when there are none); names and values are
    content."""
    calls = list(calls)
    out = Prompt()
    if not calls:
        return out
    out.own(f"{TOOL_CALLS_START}\n")
    for k, call in enumerate(calls):
        out.own("\n" if k else "").own(f'<{DSML}invoke name="').content(call.name).own('">\n')
        for j, (name, value) in enumerate(call.arguments.items()):
            is_str = isinstance(value, str)
            flag = "true" if is_str else "false"
            out.own("\n" if j else "").own(f'<{DSML}parameter name="').content(name)
            out.own(f'" string="{flag}">').content(value if is_str else _to_json(value)).own(PARAMETER_END)
        out.own(f"\n{INVOKE_END}")
    return out.own(f"\n{TOOL_CALLS_END}")


_BLOCK = re.compile(rf"{re.escape(TOOL_CALLS_START)}(?P<body>.*){re.escape(TOOL_CALLS_END)}\s*", re.DOTALL)
_INVOKE = re.compile(rf'<{DSML}invoke name="(?P<name>[^"]*)">(?P<body>.*?){re.escape(INVOKE_END)}', re.DOTALL)
_PARAMETER = re.compile(
    rf'<{DSML}parameter name="(?P<name>[^"]*)" string="(?P<string>true|false)">'
    rf"(?P<value>.*?){re.escape(PARAMETER_END)}",
    re.DOTALL,
)


def parse_tool_calls(block: str) -> list[dict[str, Any]]:
    """Parse a DSML block (from ``<｜DSML｜tool_calls>`` to the end of the text) into OpenAI tool calls.

    Returns ``[{"type": "function", "function": {"name": ..., "arguments": "<JSON object>"}}, ...]``.
    Raises ValueError on anything that is not a well-formed block: a missing closing tag, text
    between elements or after the block, a bad ``string`` flag, a repeated parameter, or a
    ``string="false"`` value that is not JSON.
    """
    m = _BLOCK.fullmatch(block)
    if m is None:
        raise ValueError(f"malformed tool call block: expected {TOOL_CALLS_START} ... {TOOL_CALLS_END}")
    invokes = _scan(_INVOKE, m.group("body"), "invoke elements")
    if not invokes:
        raise ValueError("malformed tool call block: it holds no invoke element")
    return [_parse_invoke(inv) for inv in invokes]


def _parse_invoke(invoke: re.Match[str]) -> dict[str, Any]:
    name = invoke.group("name")
    arguments: dict[str, Any] = {}
    for p in _scan(_PARAMETER, invoke.group("body"), f"parameters of tool call {name!r}"):
        key = p.group("name")
        if key in arguments:
            raise ValueError(f"tool call {name!r}: parameter {key!r} appears twice")
        arguments[key] = _parse_value(name, key, p.group("value"), p.group("string") == "true")
    return {"type": "function", "function": {"name": name, "arguments": _to_json(arguments)}}


def _parse_value(tool: str, key: str, text: str, is_str: bool) -> Any:
    if is_str:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(
            f'tool call {tool!r}: parameter {key!r} has string="false" but is not JSON: {text!r}'
        ) from None


def _scan(pattern: re.Pattern[str], text: str, what: str) -> list[re.Match[str]]:
    """All matches of ``pattern`` in ``text``, which may hold nothing else but whitespace."""
    matches, pos = [], 0
    for m in pattern.finditer(text):
        _only_whitespace(text[pos : m.start()], what)
        matches.append(m)
        pos = m.end()
    _only_whitespace(text[pos:], what)
    return matches


def _only_whitespace(gap: str, what: str) -> None:
    if gap.strip():
        raise ValueError(f"malformed tool call block: unexpected text {gap.strip()[:80]!r} among {what}")
