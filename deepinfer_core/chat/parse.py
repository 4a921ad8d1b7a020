"""Parsing one generated assistant turn back into reasoning, content and tool calls.

The completion is what the model wrote after the generation prompt. In thinking modes the prompt
already ended with ``<think>``, so the text reads ``{reasoning}</think>{content}``; in non-think mode
it is just ``{content}``. Either may end with a DSML tool-call block after a blank line, and with EOS.
V4 and V4.1 differ only in the DSML tags (:mod:`.dsml`).

Deliberate leniencies, since engines differ in what they hand back: the trailing EOS may be absent
(stop tokens are often stripped), a leading ``<think>`` is tolerated, and a thinking-mode completion
that stops before ``</think>`` (it hit ``max_tokens``) is returned as reasoning with empty content.
Everything else that is not well formed raises ValueError instead of guessing.
"""

from __future__ import annotations

from typing import Any

from deepinfer_core.chat.dsml import DsmlTags, parse_tool_calls
from deepinfer_core.chat.encodings import ChatEncoding, get_encoding
from deepinfer_core.chat.tokens import EOS, RESERVED_MARKERS, THINK_END, THINK_START


def parse_completion(
    text: str, thinking_mode: str = "non-think", *, encoding: str | ChatEncoding = "deepseek_v4"
) -> dict[str, Any]:
    """Split a completion into ``{"reasoning_content", "content", "tool_calls"}``.

    ``reasoning_content`` is None in non-think mode and a string otherwise. ``tool_calls`` is a list
    of OpenAI-style calls, ``{"type": "function", "function": {"name", "arguments"}}`` with
    ``arguments`` a JSON object string; it is empty when the model called no tool.
    """
    enc = get_encoding(encoding)
    thinking = enc.resolve_mode(thinking_mode).thinking
    if not isinstance(text, str):
        raise ValueError(f"text must be a string; got {type(text).__name__}")
    body = text.removesuffix(EOS)
    reasoning = None
    if thinking:
        reasoning, closed, body = body.removeprefix(THINK_START).partition(THINK_END)
        _check_clean(reasoning, "reasoning_content")
        if not closed:
            return {"reasoning_content": reasoning, "content": "", "tool_calls": []}
    content, block = _split_tool_calls(body, enc.tags)
    _check_clean(content, "content")
    tool_calls = parse_tool_calls(block, enc.tags) if block else []
    return {"reasoning_content": reasoning, "content": content, "tool_calls": tool_calls}


def _split_tool_calls(body: str, tags: DsmlTags) -> tuple[str, str]:
    """Content before the DSML block (minus the blank line that separates them), and the block."""
    start = body.find(tags.calls_start)
    if start < 0:
        return body, ""
    return body[:start].removesuffix("\n\n"), body[start:]


def _check_clean(text: str, field: str) -> None:
    for marker in RESERVED_MARKERS:
        if marker in text:
            raise ValueError(f"malformed completion: {field} contains the special marker {marker!r}")
