"""Every input check of render_messages raises a ValueError naming the offending field."""

from __future__ import annotations

import re

import pytest

from deepinfer_core.chat import THINKING_MODES, render_messages

USER = {"role": "user", "content": "hi"}
TOOL_CALL = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CALLING = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}


def test_unknown_thinking_mode_lists_the_allowed_modes():
    expected = "thinking_mode must be one of 'non-think', 'think-high', 'think-max'; got 'thinking'"
    with pytest.raises(ValueError, match=re.escape(expected)):
        render_messages([USER], thinking_mode="thinking")  # type: ignore[arg-type]
    assert THINKING_MODES == ("non-think", "think-high", "think-max")


@pytest.mark.parametrize(
    "messages, field",
    [
        ([], "messages must be a non-empty list"),
        ("hi", "messages must be a non-empty list"),
        (["hi"], "messages[0] must be a dict"),
        ([{"role": "latest_reminder", "content": "x"}], "messages[0].role: unknown role 'latest_reminder'"),
        (
            [{"role": "developer", "content": ""}],
            "messages[0].content must not be empty for role 'developer'",
        ),
        ([{"content": "x"}], "messages[0].role: unknown role None"),
        ([{"role": "user"}], "messages[0].content is required for role 'user'"),
        ([{"role": "system", "content": None}, USER], "messages[0].content is required for role 'system'"),
        ([{"role": "user", "content": ["hi"]}], "messages[0].content must be a string"),
        (
            [USER, {"role": "assistant"}],
            "messages[1].content is required for an assistant message without tool_calls",
        ),
        (
            [USER, {"role": "assistant", "content": "a", "reasoning_content": 3}],
            "messages[1].reasoning_content",
        ),
        ([USER, {"role": "assistant", "tool_calls": {"x": 1}}], "messages[1].tool_calls must be a list"),
        ([USER, {"role": "assistant", "tool_calls": ["f"]}], "messages[1].tool_calls[0] must be a dict"),
        (
            [USER, {"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}],
            "messages[1].tool_calls[0].type must be 'function'",
        ),
        (
            [USER, {"role": "assistant", "tool_calls": [{"name": "f"}]}],
            "messages[1].tool_calls[0].function must be",
        ),
        (
            [USER, {"role": "assistant", "tool_calls": [{"function": {"name": ""}}]}],
            "messages[1].tool_calls[0].function.name must be a non-empty string",
        ),
        (
            [USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
            "messages[1].tool_calls[0].function.arguments is not valid JSON",
        ),
        (
            [USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
            "messages[1].tool_calls[0].function.arguments must be a JSON object",
        ),
        ([USER, CALLING, {"role": "tool", "content": 7}], "messages[2].content must be a string"),
        ([USER, CALLING, {"role": "tool", "content": "r", "tool_call_id": 1}], "messages[2].tool_call_id"),
        ([{"role": "assistant", "content": "x"}], "messages[0]: an assistant message must directly follow"),
        (
            [USER, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
            "messages[2]: an assistant message must directly follow a user, tool or developer message",
        ),
        (
            [USER, {"role": "tool", "content": "r"}],
            "messages[1]: a tool message must follow an assistant message",
        ),
    ],
)
def test_bad_messages_raise_value_error_naming_the_field(messages, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        render_messages(messages)


def _fn(**fields) -> dict:
    return {"type": "function", "function": {"name": "f", **fields}}


@pytest.mark.parametrize(
    "tools, field",
    [
        ({"name": "f"}, "tools must be a list of tool dicts or None"),
        (["f"], "tools[0] must be a dict"),
        ([{"type": "retrieval", "function": {"name": "f"}}], "tools[0].type must be 'function'"),
        ([{"name": "f", "parameters": {}}], "tools[0].function must be a dict"),
        ([_fn(name="")], "tools[0].function.name must be a non-empty string"),
        ([_fn(), _fn(name=3)], "tools[1].function.name must be a non-empty string"),
        ([_fn(description=["d"])], "tools[0].function.description must be a string"),
        ([_fn(parameters=["x"])], "tools[0].function.parameters must be a JSON Schema object"),
        ([_fn(parameters={"type": "array"})], "tools[0].function.parameters must be a JSON Schema object"),
        ([_fn(), _fn()], "tools[1].function.name: duplicate tool name 'f'"),
    ],
)
def test_bad_tool_schemas_raise_value_error_naming_the_field(tools, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        render_messages([USER], tools=tools)


def test_valid_minimal_inputs_are_accepted():
    assert render_messages([USER], tools=[_fn()], thinking_mode="think-max")
    assert render_messages([USER, CALLING, {"role": "tool", "content": "r"}])
