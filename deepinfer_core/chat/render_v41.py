"""Rendering a conversation into a DeepSeek-V4.1 prompt.

Layout (thinking, effort 75, a system prompt, tools offered, one earlier turn)::

    <｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, ...)\\n\\n{system}\\n\\n{tools section}
    <｜User｜>{user}<｜Assistant｜><think>{reasoning}</think>{content}\\n\\n{DSML block}<｜end▁of▁sentence｜>
    <｜User｜><tool_result>{result}</tool_result><｜Assistant｜><think>

What differs from V4 (:mod:`.render_v4`):

- ``<｜System｜>`` opens the prompt when the first message is a system message or thinking mode writes
  its effort line, and it opens every later system message.
- Thinking mode always writes the numeric effort line (:mod:`.modes`), right after that first
  ``<｜System｜>``, before the first message's own text; ``non-think`` writes none.
- A system message after the first counts as a user turn: it ends with ``<｜Assistant｜>`` and a
  thinking marker when an assistant turn follows or the prompt ends there, and reasoning is dropped
  before the last user turn or such system message.
- DSML tags carry a leading space (``<｜DSML｜ calls>``, :data:`~deepinfer_core.chat.dsml.V41_TAGS`).
- Content may be a list of text parts (:mod:`.content`); there is no ``developer`` role.

The rest is V4's: BOS, merged user and tool turns, the tools section after a blank line in the
leading system message (an empty one is made when there is none), assistant turns, and keeping every
turn's reasoning when tools are offered.
"""

from __future__ import annotations

from typing import Any

from deepinfer_core.chat.dsml import V41_TAGS, render_tools_section
from deepinfer_core.chat.modes import resolve_v41_mode
from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.render_v4 import attach_tools, render_assistant
from deepinfer_core.chat.tokens import ASSISTANT, BOS, IMAGE_PLACEHOLDER, SYSTEM, THINK_END, THINK_START, USER
from deepinfer_core.chat.turns import Turn, build_turns
from deepinfer_core.chat.validate import MessageRules, validate_messages, validate_tools

V41_RULES = MessageRules(
    "deepseek_v41",
    ("system", "user", "assistant", "tool"),
    content_parts=True,
    mid_system_prompts=True,
    forbidden_text=(IMAGE_PLACEHOLDER,),
    nested_json_arguments=True,
    namespaces=False,
)


def render_v41(
    messages: list[dict[str, Any]],
    thinking_mode: str = "non-think",
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    reasoning_effort: Any = None,
) -> Prompt:
    """The V4.1 prompt of ``messages`` as :class:`Prompt` pieces (see the module docstring)."""
    mode = resolve_v41_mode(thinking_mode, reasoning_effort)
    functions = validate_tools(tools, V41_RULES)
    turns = build_turns(validate_messages(messages, V41_RULES))
    if functions:
        attach_tools(turns, render_tools_section(functions, V41_TAGS))
    keep_reasoning = bool(functions)
    last_user = max((i for i, t in enumerate(turns) if _is_user_turn(t, i)), default=-1)
    out = Prompt().own(BOS)
    if turns[0].role == "system" or mode.effort_prompt:
        out.own(SYSTEM + mode.effort_prompt)
    for i, turn in enumerate(turns):
        keeps = mode.thinking and (keep_reasoning or i >= last_user)
        if turn.role == "assistant":
            out.extend(render_assistant(turn.message, show_reasoning=keeps, tags=V41_TAGS))
            continue
        if turn.role == "user":
            out.own(USER)
        elif i > 0:
            out.own(SYSTEM)
        out.extend(turn.text)
        following = turns[i + 1].role if i + 1 < len(turns) else None
        opens_reply = following == "assistant" or (following is None and add_generation_prompt)
        if _is_user_turn(turn, i) and opens_reply:
            out.own(ASSISTANT + (THINK_START if keeps else THINK_END))
    return out


def _is_user_turn(turn: Turn, index: int) -> bool:
    """User turns, and system messages after the first, end with the assistant marker."""
    return turn.role == "user" or (turn.role == "system" and index > 0)
