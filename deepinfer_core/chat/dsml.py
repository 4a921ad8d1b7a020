"""DSML, the markup DeepSeek's models use for tool calls, in both directions.

A tool-call block, as V4 writes it (and as we render past calls)::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">Beijing</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

V4.1 writes the same structure with other tag names, each after a space: ``<｜DSML｜ calls>``,
``<｜DSML｜ invoke name=...>``, ``<｜DSML｜ parameter name=...>`` (:data:`V41_TAGS`).

``string="true"`` marks a raw string value, written as is (no quoting or escaping);
``string="false"`` marks any other JSON value (number, bool, null, array, object), written as compact
JSON. One ``invoke`` per call, parameters one per line, in argument order. In an assistant turn the
block follows the text content after a blank line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.tokens import DSML, TOOLS_SECTION
from deepinfer_core.chat.validate import ToolCall


@dataclass(frozen=True)
class DsmlTags:
    """The three tag names of an encoding's DSML (the text right after ``｜DSML｜``)."""

    block: str
    invoke: str
    parameter: str

    @property
    def calls_start(self) -> str:
        return f"<{DSML}{self.block}>"

    @property
    def calls_end(self) -> str:
        return f"</{DSML}{self.block}>"

    @property
    def invoke_open(self) -> str:
        return f'<{DSML}{self.invoke} name="'

    @property
    def invoke_end(self) -> str:
        return f"</{DSML}{self.invoke}>"

    @property
    def parameter_open(self) -> str:
        return f'<{DSML}{self.parameter} name="'

    @property
    def parameter_end(self) -> str:
        return f"</{DSML}{self.parameter}>"

    @cached_property
    def patterns(self) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
        """Regexes for the whole block, one invoke, one parameter."""
        block = re.compile(
            rf"{re.escape(self.calls_start)}(?P<body>.*){re.escape(self.calls_end)}\s*", re.DOTALL
        )
        invoke = re.compile(
            rf'{re.escape(self.invoke_open)}(?P<name>[^"]*)">(?P<body>.*?){re.escape(self.invoke_end)}',
            re.DOTALL,
        )
        parameter = re.compile(
            rf'{re.escape(self.parameter_open)}(?P<name>[^"]*)" string="(?P<string>true|false)">'
            rf"(?P<value>.*?){re.escape(self.parameter_end)}",
            re.DOTALL,
        )
        return block, invoke, parameter


V4_TAGS = DsmlTags("tool_calls", "invoke", "parameter")
V41_TAGS = DsmlTags(" calls", " invoke", " parameter")


def _to_json(value: Any) -> str:
    """JSON the way the reference writes it: ``", "``/``": "`` separators, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)


def render_tools_section(functions: list[dict[str, Any]], tags: DsmlTags = V4_TAGS) -> Prompt:
    """The tools part of the system prompt: instructions plus one JSON schema per line (content)."""
    text = TOOLS_SECTION.format(
        calls_start=tags.calls_start,
        calls_end=tags.calls_end,
        invoke_open=tags.invoke_open,
        invoke_end=tags.invoke_end,
        parameter_open=tags.parameter_open,
        parameter_end=tags.parameter_end,
    )
    head, tail = text.split("{schemas}")
    out = Prompt().own(head)
    for k, fn in enumerate(functions):
        out.own("\n" if k else "").content(_to_json(fn))
    return out.own(tail)


def render_tool_calls(calls: Iterable[ToolCall], tags: DsmlTags = V4_TAGS) -> Prompt:
    """A DSML block for an assistant turn's tool calls (empty when there are none); names and values are
    content."""
    calls = list(calls)
    out = Prompt()
    if not calls:
        return out
    out.own(f"{tags.calls_start}\n")
    for k, call in enumerate(calls):
        out.own("\n" if k else "").own(tags.invoke_open).content(call.name).own('">\n')
        for j, (name, value) in enumerate(call.arguments.items()):
            is_str = isinstance(value, str)
            flag = "true" if is_str else "false"
            out.own("\n" if j else "").own(tags.parameter_open).content(name)
            out.own(f'" string="{flag}">').content(value if is_str else _to_json(value)).own(
                tags.parameter_end
            )
        out.own(f"\n{tags.invoke_end}")
    return out.own(f"\n{tags.calls_end}")


def parse_tool_calls(block: str, tags: DsmlTags = V4_TAGS) -> list[dict[str, Any]]:
    """Parse a DSML block (from its opening tag to the end of the text) into OpenAI tool calls.

    Returns ``[{"type": "function", "function": {"name": ..., "arguments": "<JSON object>"}}, ...]``.
    Raises ValueError on anything that is not a well-formed block: a missing closing tag, text
    between elements or after the block, a bad ``string`` flag, a repeated parameter, or a
    ``string="false"`` value that is not JSON.
    """
    block_re, invoke_re, parameter_re = tags.patterns
    m = block_re.fullmatch(block)
    if m is None:
        raise ValueError(f"malformed tool call block: expected {tags.calls_start} ... {tags.calls_end}")
    invokes = _scan(invoke_re, m.group("body"), "invoke elements")
    if not invokes:
        raise ValueError("malformed tool call block: it holds no invoke element")
    return [_parse_invoke(inv, parameter_re) for inv in invokes]


def _parse_invoke(invoke: re.Match[str], parameter_re: re.Pattern[str]) -> dict[str, Any]:
    name = invoke.group("name")
    arguments: dict[str, Any] = {}
    for p in _scan(parameter_re, invoke.group("body"), f"parameters of tool call {name!r}"):
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
