"""Per-request decoding parameters (vLLM's names and ranges), validated on construction.

Checks that need the model (vocabulary size, ``max_model_len``) happen in the engine's input processor;
everything else is checked here. Every error is an :class:`InvalidParameterError` (a ``ValueError``)
whose message names the parameter, the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

#: most top logprobs a request may ask for, per generated or prompt token
MAX_LOGPROBS = 20
#: temperatures below this are greedy
GREEDY_EPS = 1e-5


class InvalidParameterError(ValueError):
    """A request parameter is invalid; the message names it, its value and the allowed range."""


def invalid(name: str, value: Any, allowed: str) -> InvalidParameterError:
    return InvalidParameterError(f"{name}={value!r} is invalid: {allowed}")


def check_text(name: str, text: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate, e.g. from a broken JSON escape), which no
    tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise invalid(
            name,
            text[max(0, e.start - 10) : e.end + 10],
            f"must be valid Unicode: a lone surrogate at index {e.start}",
        ) from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(init=False)
class StructuredOutputsParams:
    """Exactly one constraint: ``json`` (a JSON schema, dict or str), ``json_object``, ``regex``,
    ``choice`` (list of strings) or ``grammar`` (EBNF/Lark text). Grammar backends are plugins."""

    json: str | dict | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool = False

    def __init__(self, **kwargs: Any):
        _assign(self, kwargs, "StructuredOutputsParams")
        given = [
            f
            for f in ("json", "json_object", "regex", "choice", "grammar")
            if getattr(self, f) not in (None, False)
        ]
        if len(given) != 1:
            raise invalid(
                "structured_outputs",
                given,
                "exactly one of json, json_object, regex, choice, grammar must be set",
            )
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise invalid("structured_outputs.json", self.json, "must be a JSON schema as a dict or a string")
        if self.json_object not in (None, True, False):
            raise invalid("structured_outputs.json_object", self.json_object, "must be a bool")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise invalid(f"structured_outputs.{name}", v, "must be a non-empty string")
        if self.choice is not None and (
            not isinstance(self.choice, (list, tuple))
            or not self.choice
            or not all(isinstance(c, str) for c in self.choice)
        ):
            raise invalid("structured_outputs.choice", self.choice, "must be a non-empty list of strings")

    @property
    def kind(self) -> str:
        return next(
            f
            for f in ("json", "json_object", "regex", "choice", "grammar")
            if getattr(self, f) not in (None, False)
        )


@dataclass(init=False)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __init__(self, **kwargs: Any):
        _assign(self, kwargs, "SamplingParams")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def _validate(self) -> None:
        _check_int("n", self.n, 1, None)
        _check_real("temperature", self.temperature, "must be a finite number >= 0")
        if self.temperature < 0:
            raise invalid("temperature", self.temperature, "must be a finite number >= 0")
        _check_real("top_p", self.top_p, "must be in (0, 1]")
        if not 0 < self.top_p <= 1:
            raise invalid("top_p", self.top_p, "must be in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise invalid("top_k", self.top_k, "must be an int: -1 or 0 (disabled) or >= 1")
        _check_real("min_p", self.min_p, "must be in [0, 1]")
        if not 0 <= self.min_p <= 1:
            raise invalid("min_p", self.min_p, "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check_real(name, v, "must be in [-2, 2]")
            if not -2 <= v <= 2:
                raise invalid(name, v, "must be in [-2, 2]")
        _check_real("repetition_penalty", self.repetition_penalty, "must be a finite number > 0")
        if self.repetition_penalty <= 0:
            raise invalid("repetition_penalty", self.repetition_penalty, "must be a finite number > 0")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1, None)
        _check_int("min_tokens", self.min_tokens, 0, None)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise invalid("min_tokens", self.min_tokens, f"must be <= max_tokens={self.max_tokens}")
        if self.n > 1 and self.greedy:
            raise invalid(
                "n",
                self.n,
                "n > 1 needs random sampling (temperature > 0); greedy samples would be identical",
            )
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None:
                _check_int(name, v, 0, MAX_LOGPROBS)
        if self.seed is not None and not _is_int(self.seed):
            raise invalid("seed", self.seed, "must be an int or None")
        self._validate_stops()
        self._validate_flags()

    def _validate_stops(self) -> None:
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise invalid("stop", s, "stop strings must be non-empty strings")
            check_text("stop", s)
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise invalid("stop_token_ids", t, "token ids must be ints >= 0")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise invalid("logit_bias", self.logit_bias, "must be a dict token_id -> bias")
            bias = {}
            for k, v in self.logit_bias.items():
                tok = int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k
                if not _is_int(tok) or tok < 0:
                    raise invalid("logit_bias", k, "keys must be token ids (ints >= 0)")
                _check_real(f"logit_bias[{tok}]", v, "must be a finite number in [-100, 100]")
                if not -100 <= v <= 100:
                    raise invalid(f"logit_bias[{tok}]", v, "must be a finite number in [-100, 100]")
                bias[tok] = float(v)
            self.logit_bias = bias

    def _validate_flags(self) -> None:
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise invalid(name, getattr(self, name), "must be a bool")
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise invalid("structured_outputs", so, "must be a StructuredOutputsParams")


def _assign(obj: Any, kwargs: dict[str, Any], cls_name: str) -> None:
    names = {f.name: f for f in fields(obj)}
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise InvalidParameterError(
            f"{cls_name}: unknown parameter {unknown[0]!r}={kwargs[unknown[0]]!r}; allowed parameters: {', '.join(names)}"
        )
    for name, f in names.items():
        if name in kwargs:
            setattr(obj, name, kwargs[name])
        elif f.default_factory is not MISSING:
            setattr(obj, name, f.default_factory())
        else:
            setattr(obj, name, f.default)


def _check_int(name: str, v: Any, lo: int | None, hi: int | None) -> None:
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise invalid(name, v, f"must be an int {rng}")


def _check_real(name: str, v: Any, allowed: str) -> None:
    if not _is_real(v) or not math.isfinite(v):
        raise invalid(name, v, allowed)
