"""What both endpoints share, independent of HTTP (``run-batch`` calls the same code).

A handler turns a body into a :class:`Submission` (parse, check the model, validate and tokenize off
the event loop, queue), then either collects the final outputs or streams deltas. Everything refused
before queuing is an :class:`ApiError`; a request is queued only once all its prompts are valid.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from deepinfer_core.engine.async_llm import (
    AsyncLLM,
    EngineDeadError,
    QueueFullError,
    RequestDelta,
    RequestFailedError,
    RequestStream,
)
from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.outputs import RequestOutput
from deepinfer_core.sampling_params import SamplingParams
from deepinfer_core.serve.errors import ApiError, from_validation_error, from_value_error, server_error
from deepinfer_core.serve.metrics import RequestTimer, ServerMetrics
from deepinfer_core.serve.settings import ServeSettings

Body = TypeVar("Body", bound=BaseModel)


@dataclass
class Submission:
    """The engine requests of one API request (one per prompt), and what its response needs."""

    id: str
    model: str
    body: Any
    streams: list[RequestStream]
    timers: list[RequestTimer]
    stream: bool = False  # the client asked for server-sent events
    created: int = field(default_factory=lambda: int(time.time()))

    def abort(self) -> None:
        for s, t in zip(self.streams, self.timers, strict=True):
            if not s.finished:
                s.abort()
                t.finish("abort")


class Serving:
    """Parsing, validation and submission shared by the completions and chat handlers."""

    def __init__(
        self,
        llm: AsyncLLM,
        settings: ServeSettings,
        metrics: ServerMetrics,
        model_name: str,
        check_model: bool = True,
    ):
        self.llm, self.settings, self.metrics = llm, settings, metrics
        self.model_name = model_name
        self.check_model = check_model

    def parse(self, cls: type[Body], body: Any) -> Body:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        try:
            req = cls.model_validate(body)
        except ValidationError as e:
            raise from_validation_error(e, body) from None
        if self.check_model and req.model is not None and req.model != self.model_name:
            raise ApiError(
                404,
                f"the model {req.model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        return req

    async def process(
        self, prompts: list[Any], params: list[SamplingParams], add_special: bool, renames: dict[str, str]
    ) -> list[ProcessedPrompt]:
        try:
            return await self.llm.process(prompts, params, add_special)
        except ValueError as e:
            raise from_value_error(e, renames) from None

    def submit(self, prefix: str, req: Any, items: list[ProcessedPrompt], start: float) -> Submission:
        """Queue ``items``; ``start`` is when the request arrived (``time.perf_counter()``)."""
        rid = f"{prefix}-{uuid.uuid4().hex}"
        try:
            ids = [f"{rid}-{i}" for i in range(len(items))]
            streams = self.llm.submit(items, ids, max_waiting_requests=self.settings.max_waiting_requests)
        except QueueFullError as e:
            raise ApiError(
                503,
                f"the server is busy: {e}",
                type="server_overloaded",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            ) from None
        except EngineDeadError as e:
            raise ApiError(503, str(e), type="server_error") from None
        timers = [self.metrics.timer(start) for _ in streams]
        return Submission(rid, self.model_name, req, streams, timers, stream=bool(req.stream))

    def cap_max_tokens(self, items: list[ProcessedPrompt]) -> None:
        """Requests without ``max_tokens``: up to the end of the context, within the server's limit."""
        for it in items:
            if it.params.max_tokens is None:
                room = self.llm.max_model_len - len(it.token_ids)
                it.params.max_tokens = max(1, min(self.settings.max_tokens_limit, room))

    async def deltas(self, sub: Submission) -> AsyncIterator[tuple[int, RequestDelta]]:
        """Every engine request's deltas as they come, tagged with its prompt index."""
        if len(sub.streams) == 1:
            async for d in _timed(sub.streams[0], sub.timers[0]):
                yield 0, d
            return
        q: asyncio.Queue = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for d in _timed(sub.streams[i], sub.timers[i]):
                    q.put_nowait((i, d, None))
                q.put_nowait((i, None, None))
            except Exception as e:
                q.put_nowait((i, None, e))

        tasks = [asyncio.ensure_future(pump(i)) for i in range(len(sub.streams))]
        try:
            left = len(tasks)
            while left:
                i, d, err = await q.get()
                if err is not None:
                    raise err
                if d is None:
                    left -= 1
                else:
                    yield i, d
        finally:
            for t in tasks:
                t.cancel()

    async def finals(self, sub: Submission) -> list[RequestOutput]:
        """Wait for every prompt's final output."""
        outs: dict[int, RequestOutput] = {}
        try:
            async for i, d in self.deltas(sub):
                if d.finished:
                    outs[i] = d.output
        except RequestFailedError as e:
            sub.abort()
            raise server_error(str(e)) from None
        except EngineDeadError as e:
            raise ApiError(503, str(e), type="server_error") from None
        return [outs[i] for i in range(len(sub.streams))]


async def _timed(stream: RequestStream, timer: RequestTimer) -> AsyncIterator[RequestDelta]:
    try:
        async for d in stream:
            timer.observe(d)
            yield d
    except Exception:
        timer.finish("error")
        raise


def stream_error(e: Exception) -> dict[str, Any]:
    """The error event a stream ends with when its request fails after the response started."""
    if isinstance(e, ApiError):
        return e.body()
    return server_error(f"{type(e).__name__}: {e}").body()
