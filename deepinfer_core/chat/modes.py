"""Thinking modes and reasoning effort: what each setting changes in a prompt.

**V4.** DeepSeek's encoding has two switches: ``thinking_mode`` ("chat" or "thinking") and, in thinking
mode, ``reasoning_effort`` ("high" or "max"). Our three names are the three valid combinations, the same
three that DeepSeek's API offers:

- ``non-think``: the assistant prefix is closed at once (``<｜Assistant｜></think>``), so the model
  answers without reasoning, and stored ``reasoning_content`` is never rendered.
- ``think-high``: the generation prompt opens a reasoning block (``<｜Assistant｜><think>``).
- ``think-max``: as think-high, plus :data:`~deepinfer_core.chat.tokens.REASONING_EFFORT_MAX`
  right after BOS.

**V4.1.** Thinking is on or off, and in thinking mode the prompt states a numeric budget, an integer from
1 to 100 (``Reasoning Effort: {budget} (range 1-100, ...)``, right after the leading ``<｜System｜>``).
``reasoning_effort`` is that integer or one of the encoding's aliases ``low`` (50), ``high`` (75) and
``max`` (100); ``None`` means ``high``. Modes: ``non-think``, ``think`` (budget from ``reasoning_effort``),
and V4's names ``think-high`` and ``think-max`` as ``think`` with ``high`` and ``max``. The effort is
checked in every mode, as the encoding does, but only thinking mode writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from deepinfer_core.chat.tokens import REASONING_EFFORT_BUDGET, REASONING_EFFORT_MAX

ThinkingMode = Literal["non-think", "think-high", "think-max"]
THINKING_MODES: tuple[str, ...] = get_args(ThinkingMode)
V41_THINKING_MODES: tuple[str, ...] = ("non-think", "think", "think-high", "think-max")

EFFORT_ALIASES = {"low": 50, "high": 75, "max": 100}
DEFAULT_EFFORT = "high"
_MODE_EFFORT = {"think-high": "high", "think-max": "max"}


@dataclass(frozen=True)
class ModeSpec:
    thinking: bool
    effort_prompt: str  # text placed at the start of the prompt; empty when the mode adds none


_SPECS = {
    "non-think": ModeSpec(thinking=False, effort_prompt=""),
    "think-high": ModeSpec(thinking=True, effort_prompt=""),
    "think-max": ModeSpec(thinking=True, effort_prompt=REASONING_EFFORT_MAX),
}


def resolve_thinking_mode(thinking_mode: str, reasoning_effort: Any = None) -> ModeSpec:
    """V4: look up a mode by name; an unknown name raises a ValueError listing the allowed ones."""
    _check_mode(thinking_mode, THINKING_MODES)
    if reasoning_effort is not None:
        raise ValueError(
            "reasoning_effort is not part of the deepseek_v4 encoding; "
            f"choose thinking_mode 'think-high' or 'think-max' instead (got reasoning_effort={reasoning_effort!r})"
        )
    return _SPECS[thinking_mode]


def resolve_v41_mode(thinking_mode: str, reasoning_effort: Any = None) -> ModeSpec:
    """V4.1: thinking on or off, and the effort line thinking mode writes (see the module docstring)."""
    _check_mode(thinking_mode, V41_THINKING_MODES)
    if thinking_mode in _MODE_EFFORT:
        if reasoning_effort is not None:
            raise ValueError(
                f"thinking_mode={thinking_mode!r} sets reasoning_effort={_MODE_EFFORT[thinking_mode]!r}; "
                f"to choose reasoning_effort={reasoning_effort!r} use thinking_mode='think'"
            )
        reasoning_effort = _MODE_EFFORT[thinking_mode]
    budget = effort_budget(reasoning_effort)
    if thinking_mode == "non-think":
        return ModeSpec(thinking=False, effort_prompt="")
    return ModeSpec(thinking=True, effort_prompt=REASONING_EFFORT_BUDGET.format(budget=budget))


def effort_budget(reasoning_effort: Any) -> int:
    """The 1-100 budget of a V4.1 ``reasoning_effort``: an int (not a bool), an alias, or None."""
    effort = DEFAULT_EFFORT if reasoning_effort is None else reasoning_effort
    if type(effort) is int and 1 <= effort <= 100:
        return effort
    if isinstance(effort, str) and effort in EFFORT_ALIASES:
        return EFFORT_ALIASES[effort]
    aliases = ", ".join(f"{k!r} ({v})" for k, v in EFFORT_ALIASES.items())
    raise ValueError(
        f"reasoning_effort must be an integer from 1 to 100 or one of {aliases}; got {reasoning_effort!r}"
    )


def _check_mode(thinking_mode: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(thinking_mode, str) or thinking_mode not in allowed:
        names = ", ".join(repr(m) for m in allowed)
        raise ValueError(f"thinking_mode must be one of {names}; got {thinking_mode!r}")
