"""Golden records: a case with DeepSeek's prompt for it, and completions with DeepSeek's parse of them.

Render record: the case (``messages``, ``tools``, ``thinking_mode``, ``reasoning_effort``; ``markers``
when its text spells control tokens) plus ``prompt``, the reference encoder's output; ``id`` is its index
(the generator's seed and the index give the case back). Parse record: ``id`` of the case it came from,
``thinking_mode``, ``text`` (the reference's rendering of one of its assistant turns, as a model would
write it after the generation prompt) and ``expected`` (the reference parser's result).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chatgolden.conversations import Generator
from chatgolden.oracle import Oracle

PARSE_PER_CASE = 2


def render_record(oracle: Oracle, case: dict[str, Any], case_id: int) -> dict[str, Any]:
    return {"id": case_id, **case, "prompt": oracle.render(case)}


def parse_records(oracle: Oracle, case: dict[str, Any], case_id: int) -> list[dict[str, Any]]:
    """The last assistant turns of a case without control-token text, as completions."""
    if case.get("markers"):
        return []
    turns = [m for m in case["messages"] if m["role"] == "assistant"][-PARSE_PER_CASE:]
    out = []
    for msg in turns:
        text = oracle.completion(msg, case["thinking_mode"])
        out.append(
            {
                "id": case_id,
                "thinking_mode": case["thinking_mode"],
                "text": text,
                "expected": oracle.parse(text, case["thinking_mode"]),
            }
        )
    return out


def generate(oracle: Oracle, seed: int, ids: range) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Render and parse records of cases ``ids`` of the generator seeded with ``seed``."""
    gen = Generator(oracle.encoding, seed)
    renders, parses = [], []
    for i in ids:
        case = gen.case(i)
        renders.append(render_record(oracle, case, i))
        parses += parse_records(oracle, case, i)
    return renders, parses


def published_v4(oracle: Oracle, tests_dir: Path) -> list[dict[str, Any]]:
    """V4's published golden pairs that use only what our encoder supports (1: tools and tool calls in
    thinking mode; 2: dropped reasoning), as render records whose prompt is DeepSeek's file, checked
    against the reference first."""
    out = []
    for n, case in ((1, _published_case(tests_dir, 1)), (2, _published_case(tests_dir, 2))):
        expected = (tests_dir / f"test_output_{n}.txt").read_text(encoding="utf-8")
        if oracle.render(case) != expected:
            raise SystemExit(f"the reference does not reproduce {tests_dir}/test_output_{n}.txt")
        out.append({"id": f"published-{n}", **case, "prompt": expected})
    return out


def _published_case(tests_dir: Path, n: int) -> dict[str, Any]:
    data = json.loads((tests_dir / f"test_input_{n}.json").read_text(encoding="utf-8"))
    if isinstance(data, dict):
        return {"messages": data["messages"], "tools": data["tools"], "thinking_mode": "think-high"}
    return {"messages": data, "thinking_mode": "think-high"}
