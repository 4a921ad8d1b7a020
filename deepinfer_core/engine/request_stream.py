"""One request's side of :class:`~deepinfer_core.engine.async_llm.AsyncLLM`: the updates the step thread
sends, and the :class:`RequestStream` that turns them into :class:`RequestDelta` objects on the request's
event loop (where text is decoded, off the step thread)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.outputs import PositionLogprobs, RequestOutput
from deepinfer_core.engine.streaming import SampleProgress, TextDeltas


class QueueFullError(RuntimeError):
    """``max_waiting_requests`` requests are already waiting to be scheduled; retry later."""


class EngineDeadError(RuntimeError):
    """The step thread has stopped (shut down, or a failure it could not recover from)."""


class RequestFailedError(RuntimeError):
    """The engine failed while serving this request."""


@dataclass
class CompletionDelta:
    """What one sample gained since the previous read of its stream."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestDelta:
    request_id: str
    outputs: list[CompletionDelta]
    finished: bool = False
    #: the request's final output (as ``LLM.generate`` returns it), on the last delta
    output: RequestOutput | None = None
    #: the prompt's logprobs (``SamplingParams.prompt_logprobs``), on the first delta that has tokens
    prompt_logprobs: list[PositionLogprobs | None] | None = None


@dataclass
class StreamUpdate:
    """Step thread -> stream."""

    progress: list[SampleProgress]
    final: RequestOutput | None = None
    error: BaseException | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None


class RequestStream:
    """Async iterator of one request's :class:`RequestDelta`; reads coalesce everything queued."""

    def __init__(
        self,
        request_id: str,
        item: ProcessedPrompt,
        q: asyncio.Queue,
        tokenizer: Any,
        abort: Callable[[str], None],
    ):
        self.request_id = request_id
        self.prompt = item.prompt
        self.prompt_token_ids = item.token_ids
        self.params = item.params
        self.finished = False
        self._queue = q
        self._tokenizer = tokenizer
        self._abort = abort
        self._texts: dict[int, TextDeltas] = {}

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestDelta:
        if self.finished:
            raise StopAsyncIteration
        updates = [await self._queue.get()]
        while not self._queue.empty():
            updates.append(self._queue.get_nowait())
        return self._merge(updates)

    async def result(self) -> RequestOutput:
        """Wait for the final output."""
        last = None
        async for delta in self:
            last = delta
        assert last is not None and last.output is not None
        return last.output

    def abort(self) -> None:
        """Stop the request (no-op once finished); its blocks are freed before the next step."""
        if not self.finished:
            self.finished = True
            self._abort(self.request_id)

    def _text(self, index: int) -> TextDeltas:
        td = self._texts.get(index)
        if td is None:
            td = self._texts[index] = TextDeltas(self._tokenizer, self.prompt_token_ids, self.params)
        return td

    def _merge(self, updates: list[StreamUpdate]) -> RequestDelta:
        tokens: dict[int, list[int]] = {}
        logprobs: dict[int, list[PositionLogprobs]] = {}
        done: set[int] = set()
        final = plp = None
        for u in updates:
            if u.error is not None:
                self.finished = True
                raise u.error
            plp = u.prompt_logprobs or plp
            for p in u.progress:
                tokens.setdefault(p.index, []).extend(p.token_ids)
                if p.logprobs is not None:
                    logprobs.setdefault(p.index, []).extend(p.logprobs)
                if p.finished:
                    done.add(p.index)
            final = u.final or final
        if final is None:
            outs = [
                CompletionDelta(i, "" if i in done else self._text(i).add(t), t, logprobs.get(i))
                for i, t in sorted(tokens.items())
            ]
            return RequestDelta(self.request_id, outs, prompt_logprobs=plp)
        self.finished = True
        if final.error is not None or any(c.finish_reason == "error" for c in final.outputs):
            raise RequestFailedError(final.error or f"request {self.request_id!r} failed in the engine")
        outs = [
            CompletionDelta(
                c.index,
                self._text(c.index).finish(c.text),
                tokens.get(c.index, []),
                logprobs.get(c.index) if c.logprobs is not None else None,
                c.finish_reason,
                c.stop_reason,
            )
            for c in final.outputs
        ]
        return RequestDelta(self.request_id, outs, True, final, plp)
