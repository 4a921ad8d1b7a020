"""Chat request -> prompt, in the checkpoint's chat encoding (DeepSeek-V4 or V4.1): thinking mode and
reasoning effort, offered tools, messages.

Thinking mode, first rule that applies:

1. ``chat_template_kwargs.thinking_mode``: one of the encoding's modes (V4: ``non-think``, ``think-high``,
   ``think-max``; V4.1 also ``think``, whose budget is ``reasoning_effort``);
2. ``chat_template_kwargs.thinking`` (or ``enable_thinking``) ``false``: non-think;
3. ``reasoning_effort`` (top level, or in ``chat_template_kwargs``): ``"none"`` -> non-think. V4 has two
   levels: ``"minimal"``, ``"low"``, ``"medium"``, ``"high"`` -> think-high, ``"max"``, ``"xhigh"`` ->
   think-max. V4.1 takes a budget: an integer 1-100, or ``"low"`` / ``"high"`` / ``"max"`` (50 / 75 / 100),
   with ``"minimal"`` as low, ``"medium"`` as high and ``"xhigh"`` as max;
4. ``thinking: true``: thinking with the encoding's default effort;
5. the server's ``default_thinking_mode``.

Message content is tokenized as plain text (:func:`encode`): only the encoder writes control tokens.

``tool_choice``: ``"auto"`` (the default) offers ``tools`` and parses the model's DSML calls; ``"none"``
offers none. Forcing a call (``"required"``, a named function) is refused: the encodings have no way to
force one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepinfer_core.chat import (
    DEEPSEEK_V4,
    ChatEncoding,
    ContentTokenError,
    Prompt,
    encode_prompt,
    render_prompt,
)
from deepinfer_core.chat.content import image_url_bytes, image_urls
from deepinfer_core.serve.errors import bad_request, from_value_error
from deepinfer_core.serve.protocol import ChatCompletionRequest

_KWARGS = ("thinking_mode", "thinking", "enable_thinking", "reasoning_effort")
_V4_EFFORT = {"minimal": "think-high", "low": "think-high", "medium": "think-high", "high": "think-high"}
_V4_EFFORT |= {"max": "think-max", "xhigh": "think-max"}
_V41_EFFORT = {"minimal": "low", "low": "low", "medium": "high", "high": "high", "max": "max", "xhigh": "max"}


@dataclass(frozen=True)
class Mode:
    thinking_mode: str
    reasoning_effort: Any = None  # V4.1's budget (an int or an alias); None for V4


def thinking_mode(req: ChatCompletionRequest, default: str, encoding: ChatEncoding) -> Mode:
    """The request's mode (rules in the module docstring); a bad value is a 400 naming it."""
    kw = req.chat_template_kwargs or {}
    for key in kw:
        if key not in _KWARGS:
            raise bad_request(
                f"unknown chat_template_kwargs key {key!r}; allowed: {', '.join(_KWARGS)}",
                f"chat_template_kwargs.{key}",
            )
    mode = _choose(req, kw, default, encoding)
    try:
        encoding.resolve_mode(mode.thinking_mode, mode.reasoning_effort)
    except ValueError as e:
        param = "chat_template_kwargs.thinking_mode" if "thinking_mode" in kw else "reasoning_effort"
        raise bad_request(str(e), param) from None
    return mode


def _choose(req: ChatCompletionRequest, kw: dict[str, Any], default: str, encoding: ChatEncoding) -> Mode:
    effort = kw.get("reasoning_effort", req.reasoning_effort)
    v41 = encoding is not DEEPSEEK_V4
    if "thinking_mode" in kw:
        return Mode(kw["thinking_mode"], _v41_effort(effort) if v41 else None)
    thinking = kw.get("thinking", kw.get("enable_thinking"))
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request(
            f"chat_template_kwargs.thinking={thinking!r} is invalid: must be a bool", "chat_template_kwargs"
        )
    if thinking is False or effort == "none":
        return Mode("non-think")
    if effort is not None:
        if v41:
            return Mode("think", _v41_effort(effort))
        if effort not in _V4_EFFORT:
            allowed = ", ".join(["none", *_V4_EFFORT])
            raise bad_request(
                f"reasoning_effort={effort!r} is invalid: must be one of {allowed}", "reasoning_effort"
            )
        return Mode(_V4_EFFORT[effort])
    if thinking:
        return Mode("think" if v41 else "think-high")
    return Mode(default)


def _v41_effort(effort: Any) -> Any:
    return _V41_EFFORT.get(effort, effort) if isinstance(effort, str) else effort


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


def render(
    req: ChatCompletionRequest, mode: Mode, tools: list[dict[str, Any]] | None, encoding: ChatEncoding
) -> Prompt:
    messages = [_message(m, i, encoding) for i, m in enumerate(req.messages)]
    try:
        return render_prompt(
            messages, mode.thinking_mode, tools, reasoning_effort=mode.reasoning_effort, encoding=encoding
        )
    except ValueError as e:
        raise from_value_error(e) from None


def encode(prompt: Prompt, tokenizer: Any, messages: list[Any] | None = None) -> dict[str, Any]:
    """The engine prompt: message content tokenized as plain text, so it never becomes a control token
    (a user cannot forge turns by writing ``<｜Assistant｜>``); the images of ``messages``' ``image_url``
    parts (``data:`` URLs only) as its ``multi_modal_data``."""
    if tokenizer is None:
        raise bad_request("chat needs the model's tokenizer; this server's engine has none", "messages")
    try:
        ids = encode_prompt(prompt, tokenizer)
    except ContentTokenError as e:
        raise bad_request(str(e), "messages") from None
    out: dict[str, Any] = {"prompt": prompt.text, "prompt_token_ids": ids}
    images = []
    for url, where in image_urls(messages or []):
        try:
            images.append(image_url_bytes(url, where))
        except ValueError as e:
            raise bad_request(str(e), where) from None
    if images:
        out["multi_modal_data"] = {"image": images}
    return out


def _message(m: Any, i: int, encoding: ChatEncoding) -> Any:
    """OpenAI content parts (``[{"type": "text", "text": ...}, ...]``) joined into one string; a V4.1 user
    message with ``image_url`` parts keeps its parts (DeepSeek's blocks, each image a placeholder block)."""
    if not isinstance(m, dict) or not isinstance(m.get("content"), list):
        return m
    if any(isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"]):
        if encoding.name != "deepseek_v41":
            raise bad_request(
                f"messages[{i}].content has image parts: images need a DeepSeek-V4.1 checkpoint "
                f"(this server's chat encoding is {encoding.name})",
                f"messages[{i}].content",
            )
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
