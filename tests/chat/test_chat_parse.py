"""parse_completion: splitting generated text, and render -> parse round trips."""

from __future__ import annotations

import json

import pytest

from deepinfer_core.chat import parse_completion, render_messages

EOS = "<｜end▁of▁sentence｜>"
ASSISTANT = "<｜Assistant｜>"

DSML_CALL = (
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="location" string="true">Beijing</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="num_results" string="false">3</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)


def completion_of(prompt: str) -> str:
    """The text the model would have generated for the last assistant turn of a rendered chat."""
    start = prompt.rindex(ASSISTANT) + len(ASSISTANT)
    return prompt[start:].removeprefix("<think>").removeprefix("</think>")


def test_readme_parse_example_splits_reasoning_and_content():
    parsed = parse_completion(f"Simple arithmetic.</think>2 + 2 = 4.{EOS}", thinking_mode="think-high")
    assert parsed == {"reasoning_content": "Simple arithmetic.", "content": "2 + 2 = 4.", "tool_calls": []}


def test_non_think_has_no_reasoning_content():
    assert parse_completion(f"Hello!{EOS}") == {
        "reasoning_content": None,
        "content": "Hello!",
        "tool_calls": [],
    }


def test_trailing_eos_is_optional():
    assert parse_completion("r</think>c", "think-max") == parse_completion(f"r</think>c{EOS}", "think-max")


def test_leading_think_marker_is_tolerated():
    assert parse_completion("<think>r</think>c", "think-high")["reasoning_content"] == "r"


def test_reasoning_cut_off_before_its_end_marker_is_returned_as_reasoning():
    parsed = parse_completion("Let me think about", thinking_mode="think-high")
    assert parsed == {"reasoning_content": "Let me think about", "content": "", "tool_calls": []}


def test_tool_call_block_is_parsed_into_openai_tool_calls():
    parsed = parse_completion(f"reason</think>\n\n{DSML_CALL}{EOS}", thinking_mode="think-high")
    assert parsed["reasoning_content"] == "reason"
    assert parsed["content"] == ""
    [tc] = parsed["tool_calls"]
    assert tc["type"] == "function"
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"location": "Beijing", "num_results": 3}


def test_content_before_a_tool_call_block_is_kept():
    parsed = parse_completion(f"Let me check.\n\n{DSML_CALL}")
    assert parsed["content"] == "Let me check."
    assert len(parsed["tool_calls"]) == 1


def test_tool_call_without_arguments_round_trips():
    messages = [{"role": "user", "content": "time?"}, {"role": "assistant", "tool_calls": [_call("now", {})]}]
    parsed = parse_completion(completion_of(render_messages(messages)))
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "now", "arguments": "{}"}}]


ARGUMENTS = [
    {"location": "Beijing", "unit": "celsius"},
    {"query": '北京 "quoted" <b>tag</b>', "num_results": 3, "ratio": 0.5, "safe": False, "none": None},
    {"code": "def f():\n    return 1\n", "lines": [1, 2, 3], "opts": {"deep": {"x": [True, None]}}},
    {"empty": "", "spaces": "  padded  ", "number_as_text": "42"},
]


@pytest.mark.parametrize("mode", ["non-think", "think-high", "think-max"])
@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_render_then_parse_round_trips_tool_calls(mode, arguments):
    assistant = {
        "role": "assistant",
        "reasoning_content": "I need a tool.",
        "content": "Calling it now.",
        "tool_calls": [_call("search", arguments), _call("get_weather", {"location": "Paris"})],
    }
    tools = [_tool("search"), _tool("get_weather")]
    prompt = render_messages([{"role": "user", "content": "go"}, assistant], thinking_mode=mode, tools=tools)
    parsed = parse_completion(completion_of(prompt), thinking_mode=mode)
    assert parsed["content"] == "Calling it now."
    assert parsed["reasoning_content"] == (None if mode == "non-think" else "I need a tool.")
    got = [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in parsed["tool_calls"]]
    assert got == [("search", arguments), ("get_weather", {"location": "Paris"})]


def test_parsed_message_can_be_sent_back_in_the_next_turn():
    first = parse_completion(f"need weather</think>\n\n{DSML_CALL}{EOS}", thinking_mode="think-high")
    first["tool_calls"][0]["id"] = "call_0"
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", **first},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
    ]
    prompt = render_messages(messages, thinking_mode="think-high", tools=[_tool("get_weather")])
    assert f"<think>need weather</think>\n\n{DSML_CALL}{EOS}" in prompt
    assert prompt.endswith(f"<tool_result>sunny</tool_result>{ASSISTANT}<think>")


@pytest.mark.parametrize(
    "text, message",
    [
        (f"ok{EOS}more", "content contains the special marker"),
        ("a</think>b", "content contains the special marker '</think>'"),
        ("use <｜DSML｜invoke", "content contains the special marker"),
        (DSML_CALL.removesuffix("</｜DSML｜tool_calls>"), "malformed tool call block"),
        (f"{DSML_CALL} trailing words", "malformed tool call block"),
        ("<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>", "no invoke element"),
        (DSML_CALL.replace('string="false"', 'string="maybe"'), "malformed tool call block"),
        (DSML_CALL.replace(">3<", ">three<"), "is not JSON"),
        (DSML_CALL.replace("num_results", "location"), "appears twice"),
        (DSML_CALL.replace("</｜DSML｜invoke>\n", "</｜DSML｜invoke>\nstray\n"), "unexpected text 'stray'"),
    ],
)
def test_malformed_completions_raise_value_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_completion(text)


def test_tool_calls_inside_unfinished_reasoning_raise_value_error():
    with pytest.raises(ValueError, match="reasoning_content contains the special marker"):
        parse_completion(f"thinking...\n\n{DSML_CALL}", thinking_mode="think-high")


def test_parse_rejects_unknown_thinking_mode_and_non_string_text():
    with pytest.raises(ValueError, match="thinking_mode must be one of"):
        parse_completion("hi", thinking_mode="think")
    with pytest.raises(ValueError, match="text must be a string"):
        parse_completion(None)  # type: ignore[arg-type]


def _call(name: str, arguments: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _tool(name: str) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
    }
