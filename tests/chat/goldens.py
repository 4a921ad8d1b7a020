"""Reading the chat goldens (``tests/data/chat``, written by ``tools/chat_goldens.py``) and checking our
encoder against them. Shared by ``test_chat_goldens_v4.py`` and ``test_chat_goldens_v41.py``."""

from __future__ import annotations

import gzip
import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

from deepinfer_core.chat import encode_prompt, parse_completion, render_messages, render_prompt

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "chat"
REFERENCE_VARIABLE = "DEEPINFER_CHAT_REFERENCE"


@cache
def load(encoding: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((DATA / f"{encoding}.json.gz").read_bytes()))


def render(record: dict[str, Any], encoding: str) -> str:
    return render_messages(
        record["messages"],
        record["thinking_mode"],
        record.get("tools"),
        reasoning_effort=record.get("reasoning_effort"),
        encoding=encoding,
    )


def token_ids(record: dict[str, Any], encoding: str, tokenizer: Any) -> list[int]:
    prompt = render_prompt(
        record["messages"],
        record["thinking_mode"],
        record.get("tools"),
        reasoning_effort=record.get("reasoning_effort"),
        encoding=encoding,
    )
    return encode_prompt(prompt, tokenizer)


def parse(record: dict[str, Any], encoding: str) -> dict[str, Any]:
    """Our parse in the reference's shape: its ``reasoning_content`` is "" where ours is None (non-think)."""
    out = parse_completion(record["text"], record["thinking_mode"], encoding=encoding)
    if out["reasoning_content"] is None:
        out["reasoning_content"] = ""
    return out


def first_difference(got: str, want: str) -> str:
    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"first difference at {k}: ours {got[k : k + 60]!r}, DeepSeek's {want[k : k + 60]!r}"


def render_mismatches(encoding: str) -> list[str]:
    out = []
    for record in load(encoding)["render"]:
        try:
            got = render(record, encoding)
        except ValueError as e:
            out.append(f"case {record['id']}: raised {e}")
            continue
        if got != record["prompt"]:
            out.append(f"case {record['id']}: {first_difference(got, record['prompt'])}")
    return out


def parse_mismatches(encoding: str) -> list[str]:
    out = []
    for k, record in enumerate(load(encoding)["parse"]):
        try:
            got = parse(record, encoding)
        except ValueError as e:
            out.append(f"parse record {k} (case {record['id']}): raised {e}")
            continue
        if got != record["expected"]:
            out.append(f"parse record {k} (case {record['id']}): ours {got}, DeepSeek's {record['expected']}")
    return out


def regenerate(encoding: str, count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first ``count`` cases' records, made again by the tool with DeepSeek's code from
    ``$DEEPINFER_CHAT_REFERENCE``."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from chatgolden.oracle import load_oracle
        from chatgolden.records import generate
    finally:
        sys.path.remove(str(ROOT / "tools"))
    oracle = load_oracle(Path(os.environ[REFERENCE_VARIABLE]), encoding)
    return generate(oracle, load(encoding)["provenance"]["seed"], range(count))
