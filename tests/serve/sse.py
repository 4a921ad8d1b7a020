"""Reading server-sent events with plain httpx (no OpenAI client in between)."""

from __future__ import annotations

import json
from typing import Any

import httpx


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """Every ``data:`` event of a finished stream, parsed; checks that it ends with ``[DONE]``."""
    out: list[dict[str, Any]] = []
    done = False
    for line in response.iter_lines():
        if not line.startswith("data: "):
            assert not line.strip(), f"unexpected SSE line {line!r}"
            continue
        assert not done, "an event after [DONE]"
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
        else:
            out.append(json.loads(data))
    assert done, "the stream did not end with [DONE]"
    return out


def post_stream(url: str, body: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    with httpx.Client(timeout=120) as c, c.stream("POST", url, json=body, **kw) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return events(r)


def completion_texts(chunks: list[dict[str, Any]]) -> dict[int, str]:
    out: dict[int, str] = {}
    for ch in chunks:
        for c in ch["choices"]:
            out[c["index"]] = out.get(c["index"], "") + c["text"]
    return out
