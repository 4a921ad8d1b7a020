"""Rendering OpenAI-style messages into a model's prompt: the public entry points.

:func:`render_prompt` returns :class:`Prompt` pieces, each marked as the encoder's own text (markers and
fixed prompts) or as content (anything from the messages or tool definitions); :mod:`.encode` tokenizes
content as plain text, so only the encoder itself can emit control tokens. :func:`render_messages` is the
same prompt as one string. The format itself is the encoding's: :mod:`.render_v4` and
:mod:`.render_v41`.
"""

from __future__ import annotations

from typing import Any

from deepinfer_core.chat.encodings import ChatEncoding, get_encoding
from deepinfer_core.chat.prompt import Prompt


def render_messages(
    messages: list[dict[str, Any]],
    thinking_mode: str = "non-think",
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    reasoning_effort: Any = None,
    encoding: str | ChatEncoding = "deepseek_v4",
) -> str:
    """Render OpenAI-style ``messages`` (and offered ``tools``) as the prompt of ``encoding``'s model.

    ``add_generation_prompt`` appends ``<｜Assistant｜>`` plus the mode's thinking marker when the
    conversation ends with a message that a reply follows (user, tool, ...); a conversation ending with
    an assistant message is already complete (it ends with EOS) and gets nothing appended. The result
    starts with BOS. ``reasoning_effort`` is V4.1's (see :mod:`.modes`). To tokenize it safely use
    :func:`render_prompt` and :func:`~deepinfer_core.chat.encode.encode_prompt` (tokenizing this text
    would turn control-token text inside messages into control tokens).
    """
    return render_prompt(
        messages,
        thinking_mode,
        tools,
        add_generation_prompt,
        reasoning_effort=reasoning_effort,
        encoding=encoding,
    ).text


def render_prompt(
    messages: list[dict[str, Any]],
    thinking_mode: str = "non-think",
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    *,
    reasoning_effort: Any = None,
    encoding: str | ChatEncoding = "deepseek_v4",
) -> Prompt:
    """:func:`render_messages` as :class:`Prompt` pieces that keep content apart from the encoder's text."""
    enc = get_encoding(encoding)
    return enc.render(messages, thinking_mode, tools, add_generation_prompt, reasoning_effort)
