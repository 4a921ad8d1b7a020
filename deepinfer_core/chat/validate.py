"""Checking OpenAI-style chat input and turning it into typed records.

Every error is a ValueError whose message starts with the path of the offending field
(``messages[2].tool_calls[0].function.name``, ``tools[1].function.parameters``), so a server can hand
it straight back to the client.

What an encoding accepts is a :class:`MessageRules`. Beyond field types, two ordering rules are
enforced, because the encodings have no marker that could express anything else: an assistant message
directly follows a message that ends with ``<｜Assistant｜>`` (user, tool, V4's developer, V4.1's
system messages after the first), and a tool message directly follows an assistant message with
``tool_calls`` or another tool message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deepinfer_core.chat.content import ImagePart, text_parts
from deepinfer_core.chat.tokens import IMAGE_PLACEHOLDER


@dataclass(frozen=True)
class MessageRules:
    """What one encoding accepts."""

    encoding: str  # named in errors
    roles: tuple[str, ...]
    content_parts: bool = False  # content may be a list of text parts
    mid_system_prompts: bool = False  # a system message after the first is followed by an assistant turn
    forbidden_text: tuple[str, ...] = ()  # strings no content or reasoning may contain
    nested_json_arguments: bool = False  # arguments may be a JSON string of a JSON string of an object
    namespaces: bool = True  # a ``namespace`` on tools and tool calls is accepted (and ignored)


V4_RULES = MessageRules("deepseek_v4", ("system", "user", "assistant", "tool", "developer"))


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]  # decoded from the JSON string OpenAI clients send
    id: str | None = None


@dataclass(frozen=True)
class Message:
    role: str
    content: str  # "" for an assistant message that only calls tools; text parts joined by a blank line
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    #: the parts when content came as a list: texts, and (user messages) image placeholders
    parts: tuple[str | ImagePart, ...] | None = None


def validate_messages(messages: Any, rules: MessageRules = V4_RULES) -> list[Message]:
    """Check ``messages`` and return them as :class:`Message` records, in order."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of message dicts")
    out = [_message(m, f"messages[{i}]", rules) for i, m in enumerate(messages)]
    for i, msg in enumerate(out):
        _check_order(out, i, msg, rules)
    return out


def validate_tools(tools: Any, rules: MessageRules = V4_RULES) -> list[dict[str, Any]]:
    """Check OpenAI-style tool definitions and return their ``function`` dicts, in order."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a list of tool dicts or None; got {type(tools).__name__}")
    functions = [_tool(t, f"tools[{j}]", rules) for j, t in enumerate(tools)]
    seen: set[str] = set()
    for j, fn in enumerate(functions):
        if fn["name"] in seen:
            raise ValueError(f"tools[{j}].function.name: duplicate tool name {fn['name']!r}")
        seen.add(fn["name"])
    return functions


def _message(raw: Any, where: str, rules: MessageRules) -> Message:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a dict; got {type(raw).__name__}")
    role = raw.get("role")
    if role not in rules.roles:
        raise ValueError(
            f"{where}.role: unknown role {role!r} for the {rules.encoding} encoding; "
            f"expected one of {', '.join(rules.roles)}"
        )
    if role == "assistant":
        return _assistant(raw, where, rules)
    if raw.get("content") is None:
        raise ValueError(f"{where}.content is required for role {role!r}")
    content, parts = _content(raw, where, rules)
    if role == "developer" and not content:
        raise ValueError(f"{where}.content must not be empty for role 'developer'")
    tool_call_id = _optional_str(raw, "tool_call_id", where) if role == "tool" else None
    return Message(role=role, content=content, tool_call_id=tool_call_id, parts=parts)


def _content(raw: dict[str, Any], where: str, rules: MessageRules) -> tuple[str, tuple[str, ...] | None]:
    """The message's text, and its parts when it came as a list."""
    value = raw.get("content")
    if isinstance(value, list) and rules.content_parts:
        parts = text_parts(value, f"{where}.content")
        for k, text in enumerate(parts):
            if isinstance(text, ImagePart):
                if raw.get("role") != "user":
                    raise ValueError(f"{where}.content[{k}]: image parts are accepted in user messages only")
                continue
            _check_text(text, f"{where}.content[{k}].text", rules)
        joined = (IMAGE_PLACEHOLDER if isinstance(t, ImagePart) else t for t in parts)
        return "\n\n".join(joined), parts
    text = _optional_str(raw, "content", where, rules) or ""
    return text, None


def _assistant(raw: dict[str, Any], where: str, rules: MessageRules) -> Message:
    calls_raw = raw.get("tool_calls") or []
    if not isinstance(calls_raw, list):
        raise ValueError(f"{where}.tool_calls must be a list")
    calls = tuple(_tool_call(c, f"{where}.tool_calls[{k}]", rules) for k, c in enumerate(calls_raw))
    if raw.get("content") is None and not calls:
        raise ValueError(f"{where}.content is required for an assistant message without tool_calls")
    content, parts = _content(raw, where, rules)
    reasoning = _optional_str(raw, "reasoning_content", where, rules)
    return Message(
        role="assistant", content=content, reasoning_content=reasoning, tool_calls=calls, parts=parts
    )


def _tool_call(raw: Any, where: str, rules: MessageRules) -> ToolCall:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a dict")
    if raw.get("type", "function") != "function":
        raise ValueError(f"{where}.type must be 'function'; got {raw.get('type')!r}")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}.function must be a dict with 'name' and 'arguments'")
    _check_no_namespace(raw, fn, where, rules)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    return ToolCall(
        name=name,
        arguments=_arguments(fn.get("arguments"), f"{where}.function.arguments", rules),
        id=_optional_str(raw, "id", where),
    )


def _arguments(raw: Any, where: str, rules: MessageRules) -> dict[str, Any]:
    """Accept a JSON object as text (the OpenAI wire format) or an already decoded dict; with
    ``nested_json_arguments``, also the JSON text of that text (a client that encoded twice)."""
    if raw is None:
        return {}
    for _ in range(2 if rules.nested_json_arguments else 1):
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


def _tool(raw: Any, where: str, rules: MessageRules) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a dict like {{'type': 'function', 'function': {{...}}}}")
    if raw.get("type", "function") != "function":
        raise ValueError(f"{where}.type must be 'function'; got {raw.get('type')!r}")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}.function must be a dict with at least a 'name'")
    _check_no_namespace(raw, fn, where, rules)
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


def _check_no_namespace(raw: dict[str, Any], fn: dict[str, Any], where: str, rules: MessageRules) -> None:
    """V4.1's pinned encoding qualifies names with a tool ``namespace``; that is not implemented yet, so a
    namespace is refused rather than rendered the way an older encoding revision would."""
    if rules.namespaces:
        return
    for holder, path in ((raw, where), (fn, f"{where}.function")):
        if holder.get("namespace") is not None:
            raise ValueError(
                f"{path}.namespace: tool namespaces are not supported by the {rules.encoding} encoding yet"
            )


def _optional_str(raw: dict[str, Any], key: str, where: str, rules: MessageRules | None = None) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string; got {type(value).__name__}")
    if value is not None:
        _check_text(value, f"{where}.{key}", rules)
    return value


def _check_text(value: str, where: str, rules: MessageRules | None) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where} must be valid Unicode: a lone surrogate at index {e.start}") from None
    for marker in rules.forbidden_text if rules is not None else ():
        if marker in value:
            raise ValueError(
                f"{where} contains {marker!r}, the {rules.encoding} image placeholder; "
                "images are content parts (not supported yet), never text"
            )


def _check_order(messages: list[Message], i: int, msg: Message, rules: MessageRules) -> None:
    prev = messages[i - 1] if i > 0 else None
    if msg.role == "assistant" and not _opens_assistant(prev, i - 1, rules):
        raise ValueError(f"messages[{i}]: an assistant message must directly follow {_openers(rules)}")
    if msg.role == "tool":
        answers_calls = prev is not None and (prev.role == "tool" or bool(prev.tool_calls))
        if not answers_calls:
            raise ValueError(
                f"messages[{i}]: a tool message must follow an assistant message with tool_calls "
                "or another tool message"
            )


def _opens_assistant(prev: Message | None, index: int, rules: MessageRules) -> bool:
    """Whether the message before an assistant message ends with ``<｜Assistant｜>``."""
    if prev is None:
        return False
    if prev.role == "system":
        return rules.mid_system_prompts and index > 0
    return prev.role in ("user", "tool", "developer")


def _openers(rules: MessageRules) -> str:
    if "developer" in rules.roles:
        return "a user, tool or developer message"
    text = "a user or tool message"
    return text + ", or a system message after the first" if rules.mid_system_prompts else text
