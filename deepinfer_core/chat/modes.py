"""Thinking modes: what each of ``non-think``, ``think-high`` and ``think-max`` changes in a prompt.

DeepSeek's encoding has two switches: ``thinking_mode`` ("chat" or "thinking") and, in thinking mode,
``reasoning_effort`` ("high" or "max"). Our three names are the three valid combinations, the same
three that DeepSeek's API offers:

- ``non-think``: the assistant prefix is closed at once (``<｜Assistant｜></think>``), so the model
  answers without reasoning, and stored ``reasoning_content`` is never rendered.
- ``think-high``: the generation prompt opens a reasoning block (``<｜Assistant｜><think>``).
- ``think-max``: as think-high, plus :data:`~deepinfer_core.chat.tokens.REASONING_EFFORT_MAX`
  right after BOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from deepinfer_core.chat.tokens import REASONING_EFFORT_MAX

ThinkingMode = Literal["non-think", "think-high", "think-max"]
THINKING_MODES: tuple[str, ...] = get_args(ThinkingMode)


@dataclass(frozen=True)
class ModeSpec:
    thinking: bool
    effort_prompt: str  # text placed right after BOS; empty when the mode adds none


_SPECS = {
    "non-think": ModeSpec(thinking=False, effort_prompt=""),
    "think-high": ModeSpec(thinking=True, effort_prompt=""),
    "think-max": ModeSpec(thinking=True, effort_prompt=REASONING_EFFORT_MAX),
}


def resolve_thinking_mode(thinking_mode: str) -> ModeSpec:
    """Look up a mode by name; an unknown name raises a ValueError listing the allowed ones."""
    if not isinstance(thinking_mode, str) or thinking_mode not in _SPECS:
        allowed = ", ".join(repr(m) for m in THINKING_MODES)
        raise ValueError(f"thinking_mode must be one of {allowed}; got {thinking_mode!r}")
    return _SPECS[thinking_mode]
