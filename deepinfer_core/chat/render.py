"""Rendering a conversation into a DeepSeek-V4 prompt string.

Layout (think-high, one earlier turn, tools offered)::

    <｜begin▁of▁sentence｜>{system}\\n\\n{tools section}
    <｜User｜>{user}<｜Assistant｜><think>{reasoning}</think>{content}\\n\\n{DSML block}<｜end▁of▁sentence｜>
    <｜User｜><tool_result>{result}</tool_result><｜Assistant｜><think>

(The line breaks above are for reading only; turns are concatenated.) The rules:

- BOS opens the prompt; think-max puts its reasoning-effort prompt right after it.
- A system message is written as bare text. Offered tools are appended to the leading system message
  after a blank line; without one, an empty system message is made for them.
- There is no tool role on the wire: a run of consecutive user and tool messages becomes one user
  turn, its parts joined by a blank line, each tool result wrapped in ``<tool_result>``. Tool results
  are put in the order of the calls (by ``tool_call_id``) of the latest assistant message with calls.
- A user turn followed by an assistant turn, or ending the prompt with ``add_generation_prompt``,
  ends with ``<｜Assistant｜>`` and then ``<think>`` (reasoning follows) or ``</think>`` (no reasoning).
- An assistant turn is ``{reasoning}</think>`` (only when reasoning is shown), its content, its
  DSML block after a blank line, then EOS.
- Reasoning is shown only in thinking modes, and, unless tools are offered, only after the last user
  turn: earlier turns get ``</think>`` and lose their reasoning ("drop thinking"). With tools every
  turn keeps its reasoning, because a tool-calling agent needs its earlier reasoning to carry on.

The prompt is built as :class:`Prompt` pieces, each marked as the encoder's own text (markers and fixed
prompts) or as content (anything from the messages or tool definitions). :mod:`.encode` tokenizes content
as plain text, so only the encoder itself can emit control tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepinfer_core.chat.dsml import render_tool_calls, render_tools_section
from deepinfer_core.chat.modes import ThinkingMode, resolve_thinking_mode
from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.tokens import (
    ASSISTANT,
    BOS,
    EOS,
    THINK_END,
    THINK_START,
    TOOL_RESULT_END,
    TOOL_RESULT_START,
    USER,
)
from deepinfer_core.chat.validate import Message, validate_messages, validate_tools


@dataclass
class _Turn:
    role: str  # "system", "user" (user and tool messages merged) or "assistant"
    text: Prompt = field(default_factory=Prompt)  # system text, or the merged user text once built
    parts: list[Message] = field(default_factory=list)  # user turn: its user/tool messages
    message: Message | None = None  # assistant turn


def render_messages(
    messages: list[dict[str, Any]],
    thinking_mode: ThinkingMode = "non-think",
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """Render OpenAI-style ``messages`` (and offered ``tools``) as a DeepSeek-V4 prompt.

    ``add_generation_prompt`` appends ``<｜Assistant｜>`` plus the mode's thinking marker when the
    conversation ends with a user or tool message; a conversation ending with an assistant message
    is already complete (it ends with EOS) and gets nothing appended. The result starts with BOS.
    To tokenize it safely use :func:`render_prompt` and :func:`~deepinfer_core.chat.encode.encode_prompt`
    (tokenizing this text would turn control-token text inside messages into control tokens).
    """
    return render_prompt(messages, thinking_mode, tools, add_generation_prompt).text


def render_prompt(
    messages: list[dict[str, Any]],
    thinking_mode: ThinkingMode = "non-think",
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> Prompt:
    """:func:`render_messages` as :class:`Prompt` pieces that keep content apart from the encoder's text."""
    mode = resolve_thinking_mode(thinking_mode)
    functions = validate_tools(tools)
    turns = _build_turns(validate_messages(messages))
    if functions:
        _attach_tools(turns, render_tools_section(functions))
    keep_reasoning = bool(functions)
    last_user = max((i for i, t in enumerate(turns) if t.role == "user"), default=-1)
    out = Prompt().own(BOS + mode.effort_prompt)
    for i, turn in enumerate(turns):
        # Thinking modes show reasoning after the last user turn, or everywhere when tools are offered.
        keeps = mode.thinking and (keep_reasoning or i >= last_user)
        if turn.role == "system":
            out.extend(turn.text)
        elif turn.role == "user":
            out.own(USER).extend(turn.text)
            following = turns[i + 1].role if i + 1 < len(turns) else None
            if following == "assistant" or (following is None and add_generation_prompt):
                out.own(ASSISTANT + (THINK_START if keeps else THINK_END))
        else:
            out.extend(_render_assistant(turn.message, show_reasoning=keeps))
    return out


def _render_assistant(msg: Message | None, show_reasoning: bool) -> Prompt:
    assert msg is not None
    out = Prompt()
    if show_reasoning:
        out.content(msg.reasoning_content or "").own(THINK_END)
    out.content(msg.content)
    calls = render_tool_calls(msg.tool_calls)
    if calls:
        out.own("\n\n").extend(calls)
    return out.own(EOS)


def _build_turns(messages: list[Message]) -> list[_Turn]:
    turns: list[_Turn] = []
    call_order: dict[str, int] = {}
    for msg in messages:
        if msg.role == "system":
            turns.append(_Turn("system", text=Prompt().content(msg.content)))
        elif msg.role == "assistant":
            if msg.tool_calls:
                call_order = {c.id: k for k, c in enumerate(msg.tool_calls) if c.id}
            turns.append(_Turn("assistant", message=msg))
        elif turns and turns[-1].role == "user":
            turns[-1].parts.append(msg)
        else:
            turns.append(_Turn("user", parts=[msg]))
        if turns[-1].role == "user":
            turns[-1].text = _user_text(turns[-1].parts, call_order)
    return turns


def _user_text(parts: list[Message], call_order: dict[str, int]) -> Prompt:
    """Join a user turn's parts; tool results take the slots of tool results, in call order."""
    results = [p for p in parts if p.role == "tool"]
    if len(results) > 1 and call_order:
        # Results whose id is unknown sort as if answering the first call, as in the reference.
        ordered = iter(sorted(results, key=lambda p: call_order.get(p.tool_call_id or "", 0)))
        parts = [next(ordered) if p.role == "tool" else p for p in parts]
    out = Prompt()
    for k, p in enumerate(parts):
        if k:
            out.own("\n\n")
        if p.role == "tool":
            out.own(TOOL_RESULT_START).content(p.content).own(TOOL_RESULT_END)
        else:
            out.content(p.content)
    return out


def _attach_tools(turns: list[_Turn], section: Prompt) -> None:
    if turns and turns[0].role == "system":
        turns[0].text.own("\n\n").extend(section)
    else:
        turns.insert(0, _Turn("system", text=Prompt().own("\n\n").extend(section)))
