"""Grouping validated messages into the turns both encodings render.

There is no tool role on the wire: a run of consecutive user and tool messages becomes one user turn,
its blocks joined by a blank line, each tool result wrapped in ``<tool_result>``. A user message is one
block, or (V4.1) one block per text part. Tool results are put in the order of the calls (by
``tool_call_id``) of the latest assistant message with calls. Every other message (system, V4's
developer, assistant) is a turn of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deepinfer_core.chat.content import ImagePart
from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.tokens import IMAGE_PLACEHOLDER, TOOL_RESULT_END, TOOL_RESULT_START
from deepinfer_core.chat.validate import Message


@dataclass
class Turn:
    role: str  # "system", "developer", "user" (user and tool messages merged) or "assistant"
    text: Prompt = field(default_factory=Prompt)  # system/developer text, or the merged user text
    message: Message | None = None  # the message of a system, developer or assistant turn
    parts: list[Message] = field(default_factory=list)  # user turn: its user/tool messages


def build_turns(messages: list[Message]) -> list[Turn]:
    turns: list[Turn] = []
    call_order: dict[str, int] = {}
    for msg in messages:
        if msg.role in ("user", "tool"):
            if not turns or turns[-1].role != "user":
                turns.append(Turn("user"))
            turns[-1].parts.append(msg)
            turns[-1].text = _user_text(turns[-1].parts, call_order)
            continue
        if msg.role == "assistant" and msg.tool_calls:
            call_order = {c.id: k for k, c in enumerate(msg.tool_calls) if c.id}
        text = Prompt().content(msg.content) if msg.role != "assistant" else Prompt()
        turns.append(Turn(msg.role, text=text, message=msg))
    return turns


def _user_text(parts: list[Message], call_order: dict[str, int]) -> Prompt:
    """Join a user turn's blocks; tool results take the slots of tool results, in call order."""
    results = [p for p in parts if p.role == "tool"]
    if len(results) > 1 and call_order:
        # Results whose id is unknown sort as if answering the first call, as in the reference.
        ordered = iter(sorted(results, key=lambda p: call_order.get(p.tool_call_id or "", 0)))
        parts = [next(ordered) if p.role == "tool" else p for p in parts]
    out = Prompt()
    blocks = 0
    for p in parts:
        for text in _blocks(p):
            if blocks:
                out.own("\n\n")
            if p.role == "tool":
                out.own(TOOL_RESULT_START).content(text).own(TOOL_RESULT_END)
            elif isinstance(text, ImagePart):  # the encoder's placeholder, expanded by the model
                out.own(IMAGE_PLACEHOLDER)
            else:
                out.content(text)
            blocks += 1
    return out


def _blocks(msg: Message) -> tuple[str | ImagePart, ...]:
    """A user message's text blocks (its parts when it came as a list); a tool result is one block."""
    if msg.role == "user" and msg.parts is not None:
        return msg.parts
    return (msg.content,)
