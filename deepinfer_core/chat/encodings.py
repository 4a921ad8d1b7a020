"""The chat encodings, one per model family, and how a checkpoint's config picks one.

An encoding bundles what differs between models: the renderer, the DSML tags its tool calls use, and
the thinking modes it knows. :func:`encoding_for_config` reads ``architectures`` and ``model_type``
from a checkpoint's ``config.json``; :func:`get_encoding` takes a name or an encoding. The default
everywhere is V4, so callers that name no encoding get what they got before V4.1 existed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepinfer_core.chat.dsml import V4_TAGS, V41_TAGS, DsmlTags
from deepinfer_core.chat.modes import (
    THINKING_MODES,
    V41_THINKING_MODES,
    resolve_thinking_mode,
    resolve_v41_mode,
)
from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.render_v4 import render_v4
from deepinfer_core.chat.render_v41 import render_v41


@dataclass(frozen=True)
class ChatEncoding:
    name: str
    model_names: tuple[str, ...]  # ``architectures`` entries and ``model_type`` values that select it
    thinking_modes: tuple[str, ...]
    tags: DsmlTags
    render: Callable[..., Prompt]  # (messages, thinking_mode, tools, add_generation_prompt, reasoning_effort)
    resolve_mode: Callable[..., Any]  # (thinking_mode, reasoning_effort) -> ModeSpec, raising on bad input


DEEPSEEK_V4 = ChatEncoding(
    "deepseek_v4",
    ("DeepseekV4ForCausalLM", "deepseek_v4"),
    THINKING_MODES,
    V4_TAGS,
    render_v4,
    resolve_thinking_mode,
)
DEEPSEEK_V41 = ChatEncoding(
    "deepseek_v41",
    ("DeepseekV41ForCausalLM", "deepseek_v41"),
    V41_THINKING_MODES,
    V41_TAGS,
    render_v41,
    resolve_v41_mode,
)
ENCODINGS = {e.name: e for e in (DEEPSEEK_V4, DEEPSEEK_V41)}


def get_encoding(encoding: str | ChatEncoding) -> ChatEncoding:
    """An encoding by name (``"deepseek_v4"``, ``"deepseek_v41"``), or the one given."""
    if isinstance(encoding, ChatEncoding):
        return encoding
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {', '.join(map(repr, ENCODINGS))}; got {encoding!r}")
    return ENCODINGS[encoding]


def encoding_for_config(config: dict[str, Any]) -> ChatEncoding:
    """The encoding of a checkpoint, from its ``config.json``: the first of its ``architectures``, then its
    ``model_type``, that an encoding claims; V4 when none does."""
    names = list(config.get("architectures") or []) + [config.get("model_type")]
    for name in names:
        for enc in ENCODINGS.values():
            if name in enc.model_names:
                return enc
    return DEEPSEEK_V4
