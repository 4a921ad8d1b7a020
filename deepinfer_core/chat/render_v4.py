"""Rendering a conversation into a DeepSeek-V4 prompt.

Layout (think-high, one earlier turn, tools offered)::

    <｜begin▁of▁sentence｜>{system}\\n\\n{tools section}
    <｜User｜>{user}<｜Assistant｜><think>{reasoning}</think>{content}\\n\\n{DSML block}<｜end▁of▁sentence｜>
    <｜User｜><tool_result>{result}</tool_result><｜Assistant｜><think>

(The line breaks above are for reading only; turns are concatenated.) The rules:

- BOS opens the prompt; think-max puts its reasoning-effort prompt right after it.
- A system message is written as bare text. Offered tools are appended to the leading system message
  after a blank line; without one, an empty system message is made for them.
- User and tool messages merge into user turns (see :mod:`.turns`).
- A developer message is a user turn of its own: ``<｜User｜>`` and its text, never merged with the
  user or tool messages around it. In thinking modes without tools, a developer message before the
  last user or developer message is left out altogether.
- A user or developer turn followed by an assistant turn, or ending the prompt with
  ``add_generation_prompt``, ends with ``<｜Assistant｜>`` and then ``<think>`` (reasoning follows) or
  ``</think>`` (no reasoning).
- An assistant turn is ``{reasoning}</think>`` (only when reasoning is shown), its content, its
  DSML block after a blank line, then EOS.
- Reasoning is shown only in thinking modes, and, unless tools are offered, only after the last user
  turn: earlier turns get ``</think>`` and lose their reasoning ("drop thinking"). With tools every
  turn keeps its reasoning, because a tool-calling agent needs its earlier reasoning to carry on.
"""

from __future__ import annotations

from typing import Any

from deepinfer_core.chat.dsml import V4_TAGS, DsmlTags, render_tool_calls, render_tools_section
from deepinfer_core.chat.modes import resolve_thinking_mode
from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.tokens import ASSISTANT, BOS, EOS, THINK_END, THINK_START, USER
from deepinfer_core.chat.turns import Turn, build_turns
from deepinfer_core.chat.validate import V4_RULES, Message, validate_messages, validate_tools

_USER_LIKE = ("user", "developer")


def render_v4(
    messages: list[dict[str, Any]],
    thinking_mode: str = "non-think",
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    reasoning_effort: Any = None,
) -> Prompt:
    """The V4 prompt of ``messages`` as :class:`Prompt` pieces (see the module docstring)."""
    mode = resolve_thinking_mode(thinking_mode, reasoning_effort)
    functions = validate_tools(tools, V4_RULES)
    turns = build_turns(validate_messages(messages, V4_RULES))
    if functions:
        attach_tools(turns, render_tools_section(functions, V4_TAGS))
    keep_reasoning = bool(functions)
    if mode.thinking and not keep_reasoning:
        turns = _drop_early_developers(turns)
    last_user = max((i for i, t in enumerate(turns) if t.role in _USER_LIKE), default=-1)
    out = Prompt().own(BOS + mode.effort_prompt)
    for i, turn in enumerate(turns):
        # Thinking modes show reasoning after the last user turn, or everywhere when tools are offered.
        keeps = mode.thinking and (keep_reasoning or i >= last_user)
        if turn.role == "system":
            out.extend(turn.text)
        elif turn.role in _USER_LIKE:
            out.own(USER).extend(turn.text)
            following = turns[i + 1].role if i + 1 < len(turns) else None
            if following == "assistant" or (following is None and add_generation_prompt):
                out.own(ASSISTANT + (THINK_START if keeps else THINK_END))
        else:
            out.extend(render_assistant(turn.message, show_reasoning=keeps, tags=V4_TAGS))
    return out


def render_assistant(msg: Message | None, show_reasoning: bool, tags: DsmlTags) -> Prompt:
    """``{reasoning}</think>`` when shown, the content, the DSML block after a blank line, EOS."""
    assert msg is not None
    out = Prompt()
    if show_reasoning:
        out.content(msg.reasoning_content or "").own(THINK_END)
    out.content(msg.content)
    calls = render_tool_calls(msg.tool_calls, tags)
    if calls:
        out.own("\n\n").extend(calls)
    return out.own(EOS)


def attach_tools(turns: list[Turn], section: Prompt) -> None:
    """Append the tools section to the leading system turn, or make an empty one for it."""
    if turns and turns[0].role == "system":
        turns[0].text.own("\n\n").extend(section)
    else:
        turns.insert(0, Turn("system", text=Prompt().own("\n\n").extend(section)))


def _drop_early_developers(turns: list[Turn]) -> list[Turn]:
    last_user = max((i for i, t in enumerate(turns) if t.role in _USER_LIKE), default=-1)
    return [t for i, t in enumerate(turns) if t.role != "developer" or i >= last_user]
