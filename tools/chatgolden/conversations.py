"""Random conversations for the chat goldens, valid input for both our encoder and DeepSeek's.

A case is what a caller hands ``render_prompt``: ``messages``, ``tools``, ``thinking_mode`` and (V4.1)
``reasoning_effort``. Conversations have a system prompt or not, one to four rounds of user turns (V4:
also developer messages; V4.1: also later system messages and content as lists of text parts), assistant
replies with reasoning, content and tool calls with nested JSON arguments, tool results in shuffled order
with known, unknown or missing ids, and end with a reply to generate or with a finished assistant turn.
"""

from __future__ import annotations

import json
import random
from typing import Any

from chatgolden.texts import MARKERS_V4, MARKERS_V41, json_value, key, nonempty_text, text

TOOL_POOL: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "城市名"},
                    "days": {"type": "integer", "minimum": 1},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Web search. Split multiple queries with '||'.",
            "parameters": {
                "type": "object",
                "properties": {"queries": {"type": "string"}, "options": {"type": "object"}},
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The current time, no arguments"}},
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "timeout": {"type": "number"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "db.query",
            "description": "Query the database; returns rows as JSON\nRead-only.",
            "parameters": {
                "type": "object",
                "properties": {
                    "sql": {"type": "string"},
                    "params": {"type": "array", "items": {"type": ["string", "number", "null"]}},
                    "limit": {"type": "integer", "default": 10},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "翻译", "description": "翻译文本 → English", "parameters": {}}},
]


class Generator:
    """Makes the ``i``-th case of one encoding; the same seed and index always give the same case."""

    def __init__(self, encoding: str, seed: int):
        self.v41 = encoding == "deepseek_v41"
        self.seed = seed

    def case(self, i: int) -> dict[str, Any]:
        rng = random.Random(f"{self.seed}:{i}")
        self.rng = rng
        self.markers = (MARKERS_V41 if self.v41 else MARKERS_V4) if rng.random() < 0.08 else ()
        tools = rng.sample(TOOL_POOL, rng.randint(1, 4)) if rng.random() < 0.4 else None
        self.names = [t["function"]["name"] for t in (tools or rng.sample(TOOL_POOL, 2))]
        self.call_ids = 0
        case: dict[str, Any] = {"messages": self.messages()}
        if tools:
            case["tools"] = tools
        case.update(self.mode(i))
        if self.markers:
            case["markers"] = True
        return case

    def mode(self, i: int) -> dict[str, Any]:
        rng = self.rng
        if not self.v41:
            return {"thinking_mode": rng.choice(("non-think", "think-high", "think-max"))}
        if i < 100:  # every budget the encoding defines, once at least
            return {"thinking_mode": "think", "reasoning_effort": i + 1}
        mode = rng.choice(("non-think", "think", "think", "think", "think-high", "think-max"))
        if mode in ("think-high", "think-max"):
            return {"thinking_mode": mode}
        r = rng.random()
        effort = None if r < 0.2 else rng.choice(("low", "high", "max")) if r < 0.4 else rng.randint(1, 100)
        return (
            {"thinking_mode": mode} if effort is None else {"thinking_mode": mode, "reasoning_effort": effort}
        )

    def messages(self) -> list[dict[str, Any]]:
        rng = self.rng
        out: list[dict[str, Any]] = []
        if rng.random() < 0.6:
            out.append({"role": "system", "content": self.content(nonempty=False)})
        rounds = rng.randint(1, 4)
        for r in range(rounds):
            out += self.openers(bool(out))
            if r == rounds - 1 and rng.random() < 0.5:
                return out  # ends with a message a reply follows: a generation prompt
            out += self.replies()
            if r == rounds - 1 and out[-1]["role"] == "tool" and rng.random() < 0.5:
                return out
            if out[-1]["role"] == "tool":
                out.append(self.assistant(calls=False))
        return out

    def openers(self, after_first: bool) -> list[dict[str, Any]]:
        """One or two messages that end with the assistant marker: user, V4's developer, V4.1's later system."""
        rng = self.rng
        out = []
        for _ in range(rng.choice((1, 1, 1, 2))):
            r = rng.random()
            if not self.v41 and r < 0.12:
                out.append({"role": "developer", "content": nonempty_text(rng, self.markers)})
            elif self.v41 and after_first and r < 0.15:
                out.append({"role": "system", "content": self.content(nonempty=False)})
            else:
                out.append({"role": "user", "content": self.content(nonempty=False)})
            after_first = True
        return out

    def replies(self) -> list[dict[str, Any]]:
        """An assistant turn; when it calls tools, their results, maybe a user message, maybe more calls."""
        rng = self.rng
        out = []
        for _ in range(rng.choice((1, 1, 2))):
            calls = rng.random() < 0.45
            out.append(self.assistant(calls))
            if not calls:
                return out
            out += self.results(out[-1]["tool_calls"])
            if rng.random() < 0.15:
                out.append({"role": "user", "content": self.content(nonempty=False)})
        return out

    def assistant(self, calls: bool) -> dict[str, Any]:
        rng = self.rng
        msg: dict[str, Any] = {"role": "assistant"}
        if rng.random() < 0.75:
            msg["reasoning_content"] = text(rng, self.markers)
        if calls:
            msg["tool_calls"] = [self.call() for _ in range(rng.choice((1, 1, 2, 3)))]
            msg["content"] = rng.choice((None, "", self.content(nonempty=False)))
        else:
            msg["content"] = self.content(nonempty=False)
        return msg

    def call(self) -> dict[str, Any]:
        rng = self.rng
        args = {key(rng): json_value(rng) for _ in range(rng.choice((0, 1, 1, 2, 3)))}
        r = rng.random()
        if self.v41 and r < 0.15:
            arguments: Any = args  # V4.1's encoder takes decoded arguments; V4's would wrap them
        elif self.v41 and r < 0.2:
            arguments = json.dumps(json.dumps(args))  # encoded twice
        else:
            arguments = json.dumps(
                args, ensure_ascii=rng.random() < 0.3, separators=rng.choice(((",", ":"), None))
            )
        call: dict[str, Any] = {
            "type": "function",
            "function": {"name": rng.choice(self.names), "arguments": arguments},
        }
        if rng.random() < 0.85:
            call["id"] = f"call_{self.call_ids}"
            self.call_ids += 1
        return call

    def results(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rng = self.rng
        out = []
        for call in calls:
            msg: dict[str, Any] = {"role": "tool", "content": self.content(nonempty=False)}
            r = rng.random()
            if "id" in call and r < 0.85:
                msg["tool_call_id"] = call["id"]
            elif r < 0.92:
                msg["tool_call_id"] = "call_unknown"
            out.append(msg)
        rng.shuffle(out)
        return out

    def content(self, nonempty: bool) -> Any:
        """Text, or (V4.1, sometimes) a list of text parts, possibly empty."""
        rng = self.rng
        if self.v41 and rng.random() < 0.25:
            return [
                {"type": "text", "text": text(rng, self.markers)} for _ in range(rng.choice((0, 1, 2, 3)))
            ]
        return nonempty_text(rng, self.markers) if nonempty else text(rng, self.markers)
