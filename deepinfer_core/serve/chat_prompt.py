"""Chat request -> DeepSeek-V4 prompt text: thinking mode, offered tools, messages.

Thinking mode, first rule that applies:

1. ``chat_template_kwargs.thinking_mode``: ``"non-think"``, ``"think-high"`` or ``"think-max"``;
2. ``chat_template_kwargs.thinking`` (or ``enable_thinking``) ``false``: non-think;
3. ``reasoning_effort``: ``"none"`` -> non-think; ``"minimal"``, ``"low"``, ``"medium"``, ``"high"`` ->
   think-high; ``"max"``, ``"xhigh"`` -> think-max (V4 has two effort levels);
4. ``thinking: true``: think-high;
5. the server's ``default_thinking_mode``.

Message content is tokenized as plain text (:func:`encode`): only the encoder writes control tokens.

``tool_choice``: ``"auto"`` (the default) offers ``tools`` and parses the model's DSML calls; ``"none"``
offers none. Forcing a call (``"required"``, a named function) is refused: the V4 encoding has no way
to force one.
"""

from __future__ import annotations

from typing import Any

from deepinfer_core.chat import THINKING_MODES, ContentTokenError, Prompt, encode_prompt, render_prompt
from deepinfer_core.serve.errors import bad_request, from_value_error
from deepinfer_core.serve.protocol import ChatCompletionRequest

_KWARGS = ("thinking_mode", "thinking", "enable_thinking")
_EFFORT = {
    "none": "non-think",
    "minimal": "think-high",
    "low": "think-high",
    "medium": "think-high",
    "high": "think-high",
    "max": "think-max",
    "xhigh": "think-max",
}


def thinking_mode(req: ChatCompletionRequest, default: str) -> str:
    kw = req.chat_template_kwargs or {}
    for key in kw:
        if key not in _KWARGS:
            raise bad_request(
                f"unknown chat_template_kwargs key {key!r}; allowed: {', '.join(_KWARGS)}",
                f"chat_template_kwargs.{key}",
            )
    if "thinking_mode" in kw:
        if kw["thinking_mode"] not in THINKING_MODES:
            raise bad_request(
                f"chat_template_kwargs.thinking_mode={kw['thinking_mode']!r} is invalid: must be one of "
                + ", ".join(THINKING_MODES),
                "chat_template_kwargs.thinking_mode",
            )
        return kw["thinking_mode"]
    thinking = kw.get("thinking", kw.get("enable_thinking"))
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request(
            f"chat_template_kwargs.thinking={thinking!r} is invalid: must be a bool", "chat_template_kwargs"
        )
    if thinking is False:
        return "non-think"
    effort = req.reasoning_effort
    if effort is not None:
        if effort not in _EFFORT:
            raise bad_request(
                f"reasoning_effort={effort!r} is invalid: must be one of {', '.join(_EFFORT)}",
                "reasoning_effort",
            )
        return _EFFORT[effort]
    return "think-high" if thinking else default


def offered_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools to put in the prompt (``None``: no tool calls are parsed either)."""
    choice = req.tool_choice
    if choice is None or choice == "auto":
        return req.tools or None
    if choice == "none":
        return None
    raise bad_request(
        f"tool_choice={choice!r} is not supported: use 'auto' (the model decides) or 'none'", "tool_choice"
    )


def render(req: ChatCompletionRequest, mode: str, tools: list[dict[str, Any]] | None) -> Prompt:
    messages = [_message(m, i) for i, m in enumerate(req.messages)]
    try:
        return render_prompt(messages, thinking_mode=mode, tools=tools)
    except ValueError as e:
        raise from_value_error(e) from None


def encode(prompt: Prompt, tokenizer: Any) -> dict[str, Any]:
    """The engine prompt: message content tokenized as plain text, so it never becomes a control token
    (a user cannot forge turns by writing ``<｜Assistant｜>``)."""
    if tokenizer is None:
        raise bad_request("chat needs the model's tokenizer; this server's engine has none", "messages")
    try:
        ids = encode_prompt(prompt, tokenizer)
    except ContentTokenError as e:
        raise bad_request(str(e), "messages") from None
    return {"prompt": prompt.text, "prompt_token_ids": ids}


def _message(m: Any, i: int) -> Any:
    """OpenAI content parts (``[{"type": "text", "text": ...}, ...]``) joined into one string."""
    if not isinstance(m, dict) or not isinstance(m.get("content"), list):
        return m
    texts = []
    for j, part in enumerate(m["content"]):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(
                f"messages[{i}].content[{j}] is invalid: only text parts are supported",
                f"messages[{i}].content[{j}]",
            )
        texts.append(part["text"])
    return {**m, "content": "".join(texts)}
