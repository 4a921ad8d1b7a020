"""render_messages against exact prompts taken from DeepSeek's published V4 encoding.

The expected strings are written out by hand from the facts of the release: the examples in
``encoding/README.md`` and the golden files ``encoding/tests/test_output_{1,2}.txt`` of
deepseek-ai/DeepSeek-V4-Flash (as quoted in modelscope/ms-swift's alignment tests).
"""

from __future__ import annotations

import json

import pytest

from deepinfer_core.chat import render_messages

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SYSTEM = "You are a helpful assistant."

EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a specific location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city name"},
                "unit": {
                    "type": "string",
                    "enum": ["celsius", "fahrenheit"],
                    "description": "Temperature unit",
                },
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web for information",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Search query"},
                "num_results": {"type": "integer", "description": "Number of results to return"},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

TOOL_SCHEMAS = (
    '{"name": "get_weather", "description": "Get the weather for a specific location", "parameters": '
    '{"type": "object", "properties": {"location": {"type": "string", "description": "The city name"}, '
    '"unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}}, '
    '"required": ["location"]}}\n'
    '{"name": "search", "description": "Search the web for information", "parameters": {"type": "object", '
    '"properties": {"query": {"type": "string", "description": "Search query"}, "num_results": '
    '{"type": "integer", "description": "Number of results to return"}}, "required": ["query"]}}'
)

TOOLS_SECTION = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    'writing a "<｜DSML｜tool_calls>" block like the following:\n\n'
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="$TOOL_NAME">\n'
    '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="$TOOL_NAME2">\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types (numbers, '
    'booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n" + TOOL_SCHEMAS + "\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)


def call(name: str, arguments: dict, id: str | None = None) -> dict:
    tc = {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return tc | ({"id": id} if id else {})


# encoding/tests/test_input_2 in spirit: two turns, each with reasoning.
TWO_TURNS = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Hello"},
    {
        "role": "assistant",
        "reasoning_content": "The user said hello, I should greet back.",
        "content": "Hi there! How can I help you?",
    },
    {"role": "user", "content": "What is the capital of France?"},
    {
        "role": "assistant",
        "reasoning_content": "The user asks about the capital of France. It is Paris.",
        "content": "The capital of France is Paris.",
    },
]

# encoding/tests/test_input_1 in spirit: a tool call, its result, the final answer.
WEATHER_CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What's the weather in Beijing?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "The user wants to know the weather in Beijing. I should use the get_weather tool.",
        "tool_calls": [call("get_weather", {"location": "Beijing", "unit": "celsius"}, id="call_0")],
    },
    {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": '{"temperature": 22, "condition": "sunny", "humidity": 45}',
    },
    {
        "role": "assistant",
        "reasoning_content": "Got the weather data. Let me format a nice response.",
        "content": "The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.",
    },
]

WEATHER_CALL_DSML = (
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="location" string="true">Beijing</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="unit" string="true">celsius</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)


def test_readme_quick_start_opens_a_reasoning_block_in_think_high():
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}]
    expected = f"{BOS}{SYSTEM}{USER}What is 2+2?{ASSISTANT}<think>"
    assert render_messages(messages, thinking_mode="think-high") == expected


def test_non_think_closes_the_reasoning_block_after_every_assistant_marker():
    expected = (
        f"{BOS}{SYSTEM}"
        f"{USER}Hello{ASSISTANT}</think>Hi there! How can I help you?{EOS}"
        f"{USER}What is the capital of France?{ASSISTANT}</think>The capital of France is Paris.{EOS}"
    )
    assert render_messages(TWO_TURNS, thinking_mode="non-think") == expected


def test_non_think_is_the_default_mode():
    assert render_messages(TWO_TURNS) == render_messages(TWO_TURNS, thinking_mode="non-think")


def test_think_high_drops_reasoning_before_the_last_user_turn():
    # encoding/tests/test_output_2.txt
    expected = (
        f"{BOS}{SYSTEM}"
        f"{USER}Hello{ASSISTANT}</think>Hi there! How can I help you?{EOS}"
        f"{USER}What is the capital of France?{ASSISTANT}"
        "<think>The user asks about the capital of France. It is Paris.</think>"
        f"The capital of France is Paris.{EOS}"
    )
    prompt = render_messages(TWO_TURNS, thinking_mode="think-high")
    assert prompt == expected
    assert "The user said hello" not in prompt


def test_think_high_generation_prompt_after_a_multi_turn_history():
    expected = (
        f"{BOS}{SYSTEM}"
        f"{USER}Hello{ASSISTANT}</think>Hi there! How can I help you?{EOS}"
        f"{USER}What is the capital of France?{ASSISTANT}<think>"
    )
    assert render_messages(TWO_TURNS[:-1], thinking_mode="think-high") == expected


def test_think_max_puts_the_reasoning_effort_prompt_right_after_bos():
    high = render_messages(TWO_TURNS, thinking_mode="think-high")
    assert render_messages(TWO_TURNS, thinking_mode="think-max") == BOS + EFFORT_MAX + high[len(BOS) :]


def test_think_max_prompt_precedes_the_first_user_turn_without_system():
    messages = [{"role": "user", "content": "Prove it."}]
    expected = f"{BOS}{EFFORT_MAX}{USER}Prove it.{ASSISTANT}<think>"
    assert render_messages(messages, thinking_mode="think-max") == expected


def test_tool_conversation_matches_the_published_golden_prompt():
    # encoding/tests/test_output_1.txt
    expected = (
        f"{BOS}{SYSTEM}\n\n{TOOLS_SECTION}"
        f"{USER}What's the weather in Beijing?{ASSISTANT}"
        "<think>The user wants to know the weather in Beijing. I should use the get_weather tool.</think>"
        f"\n\n{WEATHER_CALL_DSML}{EOS}"
        f'{USER}<tool_result>{{"temperature": 22, "condition": "sunny", "humidity": 45}}</tool_result>'
        f"{ASSISTANT}<think>Got the weather data. Let me format a nice response.</think>"
        f"The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.{EOS}"
    )
    assert render_messages(WEATHER_CHAT, thinking_mode="think-high", tools=TOOLS) == expected


def test_offered_tools_keep_reasoning_of_every_turn():
    messages = WEATHER_CHAT + [
        {"role": "user", "content": "And Shanghai?"},
        {"role": "assistant", "reasoning_content": "Same tool, new city.", "content": "It is 26°C."},
    ]
    prompt = render_messages(messages, thinking_mode="think-high", tools=TOOLS)
    assert "<think>The user wants to know the weather in Beijing." in prompt
    assert "<think>Got the weather data. Let me format a nice response.</think>" in prompt
    assert prompt.endswith(
        f"{USER}And Shanghai?{ASSISTANT}<think>Same tool, new city.</think>It is 26°C.{EOS}"
    )


def test_without_tools_reasoning_before_a_tool_result_is_dropped():
    prompt = render_messages(WEATHER_CHAT, thinking_mode="think-high")
    assert TOOLS_SECTION not in prompt
    assert f"{ASSISTANT}</think>\n\n{WEATHER_CALL_DSML}{EOS}" in prompt
    assert "I should use the get_weather tool" not in prompt


def test_non_think_tool_calls_render_without_reasoning():
    expected = (
        f"{BOS}{SYSTEM}\n\n{TOOLS_SECTION}"
        f"{USER}What's the weather in Beijing?{ASSISTANT}</think>\n\n{WEATHER_CALL_DSML}{EOS}"
        f'{USER}<tool_result>{{"temperature": 22, "condition": "sunny", "humidity": 45}}</tool_result>'
        f"{ASSISTANT}</think>"
    )
    assert render_messages(WEATHER_CHAT[:4], thinking_mode="non-think", tools=TOOLS) == expected


def test_tools_without_a_system_message_get_an_empty_system_prompt():
    messages = [{"role": "user", "content": "Hi"}]
    expected = f"{BOS}\n\n{TOOLS_SECTION}{USER}Hi{ASSISTANT}</think>"
    assert render_messages(messages, tools=TOOLS) == expected


def test_parallel_tool_results_merge_into_one_user_turn_in_call_order():
    messages = [
        {"role": "user", "content": "weather in Beijing and Shanghai?"},
        {
            "role": "assistant",
            "content": "Let me check both.",
            "tool_calls": [
                call("get_weather", {"location": "Beijing"}, id="a"),
                call("get_weather", {"location": "Shanghai"}, id="b"),
            ],
        },
        # Results arrive out of order; they are rendered in the order of the calls.
        {"role": "tool", "tool_call_id": "b", "content": '{"temperature": 26}'},
        {"role": "tool", "tool_call_id": "a", "content": '{"temperature": 22}'},
    ]
    expected = (
        f"{BOS}{USER}weather in Beijing and Shanghai?{ASSISTANT}</think>Let me check both.\n\n"
        "<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="location" string="true">Beijing</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="location" string="true">Shanghai</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        f"</｜DSML｜tool_calls>{EOS}"
        f'{USER}<tool_result>{{"temperature": 22}}</tool_result>\n\n<tool_result>{{"temperature": 26}}</tool_result>'
        f"{ASSISTANT}</think>"
    )
    assert render_messages(messages) == expected


def test_user_message_after_tool_results_joins_the_same_user_turn():
    messages = WEATHER_CHAT[:4] + [{"role": "user", "content": "Thanks!"}]
    prompt = render_messages(messages)
    assert prompt.endswith(f"</tool_result>\n\nThanks!{ASSISTANT}</think>")
    assert prompt.count(USER) == 2


def test_non_string_arguments_render_as_json_with_string_false():
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("search", {"query": "北京 weather", "num_results": 3, "safe": True, "tags": ["a"]})
            ],
        },
    ]
    prompt = render_messages(messages)
    assert '<｜DSML｜parameter name="query" string="true">北京 weather</｜DSML｜parameter>' in prompt
    assert '<｜DSML｜parameter name="num_results" string="false">3</｜DSML｜parameter>' in prompt
    assert '<｜DSML｜parameter name="safe" string="false">true</｜DSML｜parameter>' in prompt
    assert '<｜DSML｜parameter name="tags" string="false">["a"]</｜DSML｜parameter>' in prompt


def test_dict_arguments_render_like_their_json_string():
    as_text = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [call("f", {"x": 1})]}]
    as_dict = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
    ]
    assert render_messages(as_text) == render_messages(as_dict)


@pytest.mark.parametrize("mode", ["non-think", "think-high", "think-max"])
def test_no_generation_prompt_leaves_the_last_user_turn_open(mode):
    prompt = render_messages(TWO_TURNS[:-1], thinking_mode=mode, add_generation_prompt=False)
    assert prompt.endswith(f"{USER}What is the capital of France?")


@pytest.mark.parametrize("mode", ["non-think", "think-high", "think-max"])
def test_conversation_ending_with_assistant_gets_no_generation_prompt(mode):
    prompt = render_messages(TWO_TURNS, thinking_mode=mode)
    assert prompt.endswith(f"The capital of France is Paris.{EOS}")


def test_render_does_not_modify_the_callers_messages():
    messages = json.loads(json.dumps(WEATHER_CHAT))
    render_messages(messages, thinking_mode="think-max", tools=TOOLS)
    assert messages == WEATHER_CHAT
