"""Checking OpenAI-style chat input and turning it into typed records.

Every error is a ValueError whose message starts with the path of the offending field
(``messages[2].tool_calls[0].function.name``, ``tools[1].function.parameters``), so a server can hand
it straight back to the client.

Beyond field types, two ordering rules are enforced, because the encoding has no marker that could
express anything else: an assistant message directly follows a user or tool message (the
``<｜Assistant｜>`` marker is written at the end of the user turn), and a tool message directly follows
an assistant message with ``tool_calls`` or another tool message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]  # decoded from the JSON string OpenAI clients send
    id: str | None = None


@dataclass(frozen=True)
class Message:
    role: str
    content: str  # "" for an assistant message that only calls tools
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


def validate_messages(messages: Any) -> list[Message]:
    """Check ``messages`` and return them as :class:`Message` records, in order."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of message dicts")
    out = [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    for i, msg in enumerate(out):
        _check_order(out, i, msg)
    return out


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """Check OpenAI-style tool definitions and return their ``function`` dicts, in order."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a list of tool dicts or None; got {type(tools).__name__}")
    functions = [_tool(t, f"tools[{j}]") for j, t in enumerate(tools)]
    seen: set[str] = set()
    for j, fn in enumerate(functions):
        if fn["name"] in seen:
            raise ValueError(f"tools[{j}].function.name: duplicate tool name {fn['name']!r}")
        seen.add(fn["name"])
    return functions


def _message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a dict; got {type(raw).__name__}")
    role = raw.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}.role: unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if role == "assistant":
        return _assistant(raw, where)
    content = _required_str(raw, "content", where, role)
    tool_call_id = _optional_str(raw, "tool_call_id", where) if role == "tool" else None
    return Message(role=role, content=content, tool_call_id=tool_call_id)


def _assistant(raw: dict[str, Any], where: str) -> Message:
    calls_raw = raw.get("tool_calls") or []
    if not isinstance(calls_raw, list):
        raise ValueError(f"{where}.tool_calls must be a list")
    calls = tuple(_tool_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls_raw))
    if raw.get("content") is None and not calls:
        raise ValueError(f"{where}.content is required for an assistant message without tool_calls")
    content = _optional_str(raw, "content", where) or ""
    reasoning = _optional_str(raw, "reasoning_content", where)
    return Message(role="assistant", content=content, reasoning_content=reasoning, tool_calls=calls)


def _tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a dict")
    if raw.get("type", "function") != "function":
        raise ValueError(f"{where}.type must be 'function'; got {raw.get('type')!r}")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}.function must be a dict with 'name' and 'arguments'")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    return ToolCall(
        name=name,
        arguments=_arguments(fn.get("arguments"), f"{where}.function.arguments"),
        id=_optional_str(raw, "id", where),
    )


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    """Accept a JSON object as text (the OpenAI wire format) or an already decoded dict."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a JSON object; got {type(raw).__name__}")
    for key in raw:
        if '"' in key:
            raise ValueError(f"{where}: argument name {key!r} must not contain '\"'")
    return raw


def _tool(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a dict like {{'type': 'function', 'function': {{...}}}}")
    if raw.get("type", "function") != "function":
        raise ValueError(f"{where}.type must be 'function'; got {raw.get('type')!r}")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}.function must be a dict with at least a 'name'")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    if "description" in fn and not isinstance(fn["description"], str):
        raise ValueError(f"{where}.function.description must be a string")
    params = fn.get("parameters")
    if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
        raise ValueError(
            f"{where}.function.parameters must be a JSON Schema object (a dict of type 'object')"
        )
    return fn


def _required_str(raw: dict[str, Any], key: str, where: str, role: str) -> str:
    if raw.get(key) is None:
        raise ValueError(f"{where}.{key} is required for role {role!r}")
    return _optional_str(raw, key, where) or ""


def _optional_str(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string; got {type(value).__name__}")
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{where}.{key} must be valid Unicode: a lone surrogate at index {e.start}"
            ) from None
    return value


def _check_order(messages: list[Message], i: int, msg: Message) -> None:
    prev = messages[i - 1] if i > 0 else None
    if msg.role == "assistant" and (prev is None or prev.role not in ("user", "tool")):
        raise ValueError(f"messages[{i}]: an assistant message must directly follow a user or tool message")
    if msg.role == "tool":
        answers_calls = prev is not None and (prev.role == "tool" or bool(prev.tool_calls))
        if not answers_calls:
            raise ValueError(
                f"messages[{i}]: a tool message must follow an assistant message with tool_calls "
                "or another tool message"
            )
