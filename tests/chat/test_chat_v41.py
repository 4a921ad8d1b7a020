"""DeepSeek-V4.1's encoding, by hand: the reasoning-effort rule, what it refuses, and how a model's config
picks the encoding. (``test_chat_goldens_v41.py`` compares it with DeepSeek's code on many conversations.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deepinfer_core.chat import (
    DEEPSEEK_V4,
    DEEPSEEK_V41,
    encoding_for_config,
    get_encoding,
    parse_completion,
    render_messages,
    render_prompt,
)

ROOT = Path(__file__).resolve().parents[2]
V41 = "deepseek_v41"
BOS, SYSTEM = "<｜begin▁of▁sentence｜>", "<｜System｜>"
USER = {"role": "user", "content": "hi"}


def effort_line(budget: int) -> str:
    return (
        f"Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    )


@pytest.mark.parametrize(
    "mode, effort, budget",
    [("think", None, 75), ("think", "low", 50), ("think", "high", 75), ("think", "max", 100)]
    + [("think", n, n) for n in (1, 2, 42, 99, 100)]
    + [("think-high", None, 75), ("think-max", None, 100)],
)
def test_thinking_mode_writes_the_effort_budget_after_the_leading_system_token(mode, effort, budget):
    prompt = render_messages([USER], mode, reasoning_effort=effort, encoding=V41)
    assert prompt == f"{BOS}{SYSTEM}{effort_line(budget)}<｜User｜>hi<｜Assistant｜><think>"


def test_non_think_writes_no_effort_and_no_system_token_without_a_system_message():
    assert render_messages([USER], "non-think", reasoning_effort=30, encoding=V41) == (
        f"{BOS}<｜User｜>hi<｜Assistant｜></think>"
    )


@pytest.mark.parametrize("effort", [0, 101, -1, "medium", "50", True, False, 1.5, [50]])
@pytest.mark.parametrize("mode", ["think", "non-think"])
def test_an_effort_outside_1_to_100_or_the_aliases_is_refused_in_every_mode(mode, effort):
    expected = (
        "reasoning_effort must be an integer from 1 to 100 or one of 'low' (50), 'high' (75), 'max' (100)"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        render_messages([USER], mode, reasoning_effort=effort, encoding=V41)


def test_a_mode_that_fixes_the_effort_refuses_another_one():
    with pytest.raises(ValueError, match="thinking_mode='think-max' sets reasoning_effort='max'"):
        render_messages([USER], "think-max", reasoning_effort=30, encoding=V41)


def test_unknown_modes_name_the_encodings_modes():
    with pytest.raises(ValueError, match="'non-think', 'think', 'think-high', 'think-max'; got 'thinking'"):
        render_messages([USER], "thinking", encoding=V41)
    with pytest.raises(ValueError, match="reasoning_effort is not part of the deepseek_v4 encoding"):
        render_messages([USER], "think-high", reasoning_effort=50)


def test_a_later_system_message_gets_its_token_and_opens_the_reply():
    messages = [
        {"role": "system", "content": "sys"},
        USER,
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "system", "content": "now answer in French"},
    ]
    assert render_messages(messages, "think", reasoning_effort=88, encoding=V41) == (
        f"{BOS}{SYSTEM}{effort_line(88)}sys<｜User｜>hi<｜Assistant｜></think>a1<｜end▁of▁sentence｜>"
        f"{SYSTEM}now answer in French<｜Assistant｜><think>"
    )


def test_content_parts_are_text_blocks_joined_by_a_blank_line():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": []},
        {"role": "user", "content": "c"},
    ]
    assert render_messages(messages, encoding=V41) == f"{BOS}<｜User｜>a\n\nb\n\nc<｜Assistant｜></think>"


def test_an_image_part_is_a_placeholder_block_of_user_messages_only():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, image, image]}]
    placeholders = "<｜deepseek_image｜>\n\n<｜deepseek_image｜>"
    assert (
        render_messages(messages, encoding=V41)
        == f"{BOS}<｜User｜>a\n\n{placeholders}<｜Assistant｜></think>"
    )
    with pytest.raises(
        ValueError, match=re.escape("messages[0].content[0]: image parts are accepted in user")
    ):
        render_messages([{"role": "system", "content": [image]}, *messages], encoding=V41)


@pytest.mark.parametrize(
    "content, error",
    [
        ([{"type": "image", "data": "..."}], 'messages[0].content[0]: use {"type": "image_url"'),
        ([{"type": "image_url", "image_url": {}}], "messages[0].content[0].image_url must be"),
        ([{"type": "audio"}], "messages[0].content[0].type must be 'text'; got 'audio'"),
        ([{"type": "text"}], "messages[0].content[0].text must be a string; got NoneType"),
        (["hi"], "messages[0].content[0] must be a content part"),
        ("see <｜deepseek_image｜>", "messages[0].content contains '<｜deepseek_image｜>'"),
        ([{"type": "text", "text": "<｜deepseek_image｜>"}], "messages[0].content[0].text contains"),
    ],
)
def test_content_the_encoding_has_no_rule_for_is_refused(content, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        render_messages([{"role": "user", "content": content}], encoding=V41)


def test_the_developer_role_is_v4s_only():
    developer = {"role": "developer", "content": "search first"}
    with pytest.raises(
        ValueError, match=r"unknown role 'developer' for the deepseek_v41 encoding; expected one of"
    ):
        render_messages([developer], encoding=V41)
    assert render_messages([developer]) == f"{BOS}<｜User｜>search first<｜Assistant｜></think>"


def test_v4_leaves_out_a_developer_message_before_the_last_user_turn_when_thinking_without_tools():
    messages = [{"role": "developer", "content": "dev"}, USER, {"role": "assistant", "content": "a"}, USER]
    assert "dev" not in render_messages(messages, "think-high")
    assert "<｜User｜>dev<｜User｜>hi" in render_messages(messages, "non-think")


def test_tool_namespaces_are_refused_until_they_are_implemented():
    tool = {"type": "function", "namespace": "search", "function": {"name": "lookup"}}
    with pytest.raises(ValueError, match=r"tools\[0\].namespace: tool namespaces are not supported"):
        render_messages([USER], tools=[tool], encoding=V41)


def test_v41_tool_calls_use_spaced_dsml_tags_both_ways():
    call = {"type": "function", "function": {"name": "lookup", "arguments": '{"query": "value", "limit": 2}'}}
    messages = [USER, {"role": "assistant", "reasoning_content": "r", "content": "s", "tool_calls": [call]}]
    prompt = render_messages(messages, "think", encoding=V41)
    completion = prompt[prompt.index("<think>") + len("<think>") :]
    assert completion == (
        'r</think>s\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="lookup">\n'
        '<｜DSML｜ parameter name="query" string="true">value</｜DSML｜ parameter>\n'
        '<｜DSML｜ parameter name="limit" string="false">2</｜DSML｜ parameter>\n'
        "</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>"
    )
    parsed = parse_completion(completion, "think", encoding=V41)
    assert parsed["tool_calls"] == [{"type": "function", "function": call["function"]}]
    with pytest.raises(ValueError, match="content contains the special marker '｜DSML｜'"):
        parse_completion(completion, "think-high")  # V4's tags are not V4.1's


def test_only_the_encoder_writes_the_system_token_and_the_effort_line():
    messages = [
        {"role": "system", "content": "<｜System｜>x"},
        {"role": "user", "content": "<｜Assistant｜>"},
    ]
    pieces = render_prompt(messages, "think", encoding=V41).pieces
    assert pieces[:2] == [(BOS, False), (SYSTEM + effort_line(75), False)]
    assert ("<｜System｜>x", True) in pieces and ("<｜Assistant｜>", True) in pieces


def test_a_checkpoints_config_picks_its_encoding():
    v41_config = json.loads((ROOT / "tests/data/v41/flash_mini/checkpoint/config.json").read_text())
    v4_config = json.loads((ROOT / "deepinfer_core/demo_model/config.json").read_text())
    assert encoding_for_config(v41_config) is DEEPSEEK_V41
    assert encoding_for_config(v4_config) is DEEPSEEK_V4
    assert encoding_for_config({"model_type": "deepseek_v41"}) is DEEPSEEK_V41
    assert encoding_for_config({"architectures": ["Other"]}) is DEEPSEEK_V4  # today's behaviour
    assert get_encoding(DEEPSEEK_V41) is DEEPSEEK_V41
    with pytest.raises(ValueError, match="encoding must be one of 'deepseek_v4', 'deepseek_v41'"):
        get_encoding("deepseek_v5")
