"""``deepinfer run-batch``: answer an OpenAI batch file with the server's own handlers, no HTTP.

Input, one JSON object per line: ``{"custom_id": str, "method": "POST", "url": "/v1/completions" or
"/v1/chat/completions", "body": {...}}``. Output, one line per input line, in input order::

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code": 200, "request_id": ..., "body": {...}},
     "error": null}

A request the handlers refuse gets its status and error body in ``response`` and the same error in
``error``; a line that is not a request at all (not JSON, a missing field, an unknown url) gets
``"response": null`` and its ``error``. No line stops the file. Lines run concurrently, up to
``max_concurrency`` at a time, so the engine's batch stays full; blank lines are skipped.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from deepinfer_core.engine.async_llm import AsyncLLM
from deepinfer_core.serve.chat import ChatServing
from deepinfer_core.serve.completions import CompletionsServing
from deepinfer_core.serve.errors import ApiError
from deepinfer_core.serve.metrics import ServerMetrics
from deepinfer_core.serve.settings import ServeSettings

_FIELDS = ("custom_id", "method", "url", "body")


@dataclass
class BatchSummary:
    total: int = 0
    succeeded: int = 0
    failed: int = 0


class BatchRunner:
    def __init__(self, llm: AsyncLLM, settings: ServeSettings, model_name: str):
        metrics = ServerMetrics(llm)
        settings = settings.model_copy(update={"max_waiting_requests": None})  # max_concurrency bounds it
        self.routes = {
            "/v1/completions": CompletionsServing(llm, settings, metrics, model_name, check_model=False),
            "/v1/chat/completions": ChatServing(llm, settings, metrics, model_name, check_model=False),
        }

    async def run(
        self,
        lines: TextIO,
        out: TextIO,
        max_concurrency: int = 256,
        progress: bool = True,
        total: int | None = None,
    ) -> BatchSummary:
        """Answer ``lines`` into ``out``; ``total`` (the number of non-blank lines, if known) gives the
        progress bar its end."""
        from tqdm.auto import tqdm

        summary = BatchSummary()
        bar = tqdm(desc="Batch requests", unit="req", total=total, disable=not progress, dynamic_ncols=True)
        slots = asyncio.Semaphore(max_concurrency)
        window: deque[asyncio.Future] = deque()

        def write(record: dict[str, Any]) -> None:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            summary.total += 1
            summary.succeeded += record["error"] is None
            summary.failed += record["error"] is not None
            bar.update(1)

        async def one(lineno: int, line: str) -> dict[str, Any]:
            try:
                return await self.answer(lineno, line)
            finally:
                slots.release()

        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            await slots.acquire()
            window.append(asyncio.ensure_future(one(lineno, line)))
            while window and window[0].done():
                write(window.popleft().result())
        while window:
            write(await window.popleft())
        bar.close()
        return summary

    async def answer(self, lineno: int, line: str) -> dict[str, Any]:
        """The output record of one input line; never raises for a bad line."""
        record: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": None, "response": None}
        try:
            req = _json(line, lineno)
            record["custom_id"] = req.get("custom_id")
            _check(req, lineno)
        except ValueError as e:
            return {**record, "error": {"code": "invalid_request", "message": str(e)}}
        handler = self.routes[req["url"]]
        try:
            if not isinstance(req["body"], dict) or req["body"].get("stream"):
                raise ApiError(400, "stream is not supported in a batch", param="stream")
            sub = await handler.submit_body(req["body"])
            body = await handler.response(sub)
        except ApiError as e:
            response = {"status_code": e.status, "request_id": None, "body": e.body()}
            return {**record, "response": response, "error": {"code": e.code or e.type, "message": e.message}}
        except Exception as e:  # an engine failure is this line's error, not the file's
            return {**record, "error": {"code": "server_error", "message": f"{type(e).__name__}: {e}"}}
        response = {"status_code": 200, "request_id": body["id"], "body": body}
        return {**record, "response": response, "error": None}


def _json(line: str, lineno: int) -> dict[str, Any]:
    try:
        req = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"line {lineno}: not JSON ({e})") from None
    if not isinstance(req, dict):
        raise ValueError(f"line {lineno}: expected a JSON object with {', '.join(_FIELDS)}")
    return req


def _check(req: dict[str, Any], lineno: int) -> None:
    missing = [f for f in _FIELDS if f not in req]
    if missing:
        raise ValueError(f"line {lineno}: missing {', '.join(missing)}")
    if req["method"] != "POST":
        raise ValueError(f"line {lineno}: method {req['method']!r} is not supported (POST)")
    if req["url"] not in ("/v1/completions", "/v1/chat/completions"):
        raise ValueError(
            f"line {lineno}: url {req['url']!r} is not supported (/v1/completions, /v1/chat/completions)"
        )
    return req


def run_batch(
    llm: AsyncLLM,
    settings: ServeSettings,
    model_name: str,
    input_path: str | Path,
    output_path: str | Path,
    max_concurrency: int = 256,
    progress: bool = True,
) -> BatchSummary:
    """Answer every line of ``input_path`` into ``output_path`` (see the module docstring)."""
    runner = BatchRunner(llm, settings, model_name)
    with open(input_path, encoding="utf-8") as inp:
        total = sum(1 for line in inp if line.strip())
    with open(input_path, encoding="utf-8") as inp, open(output_path, "w", encoding="utf-8") as out:
        return asyncio.run(runner.run(inp, out, max_concurrency, progress, total))
