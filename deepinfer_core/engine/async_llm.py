"""``AsyncLLM``: the engine behind an asyncio front, one async stream of outputs per request.

Threads. One *step thread* owns the :class:`LLMEngine` and is the only thread that ever calls into it:
it adds requests, aborts them and steps the engine. Everything else reaches it through a thread-safe
inbox, so the engine needs no locking. Each request's outputs travel back to the event loop that
submitted it through an ``asyncio.Queue`` fed by ``loop.call_soon_threadsafe`` (one call per loop per
step, whatever the number of requests). The step thread never waits on a client: it hands its
updates to the loops and goes on; a client that reads slowly only makes its own queue longer.

Life of a request:

1. :meth:`AsyncLLM.process` validates and tokenizes (and compiles a grammar) in a worker thread, off
   both the event loop and the step loop; errors are raised to that caller only.
2. :meth:`AsyncLLM.submit` queues it, or raises :class:`QueueFullError` when ``max_waiting_requests``
   requests are already waiting to be scheduled.
3. The caller iterates the :class:`RequestStream`: one :class:`RequestDelta` per read, holding
   everything the request gained since the previous read (new token ids, text, logprobs), and a last
   one with ``finished=True`` and the final :class:`RequestOutput`.
4. ``stream.abort()`` (or an :meth:`AsyncLLM.abort`) reaches the step thread at its next iteration,
   which aborts the request in the engine at once: its KV blocks and grammar state are freed before
   the next step.

Failures. A request the engine finishes with ``finish_reason="error"`` fails alone: its stream raises
:class:`RequestFailedError`. A step that raises (the engine could not tell whose fault it was) fails
every request in flight the same way, removes them from the engine, and the loop goes on serving new
requests.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from deepinfer_core.config import ConfigError, EngineConfig
from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.engine.outputs import PositionLogprobs, RequestOutput
from deepinfer_core.engine.streaming import ProgressTracker, SampleProgress, TextDeltas
from deepinfer_core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the step thread publishes after every iteration."""

    num_running: int = 0  # requests scheduled at least once and not finished
    num_waiting: int = 0  # requests submitted and not yet scheduled
    kv_blocks_in_use: dict[str, int] = field(default_factory=dict)  # cache group -> blocks
    kv_blocks_total: dict[str, int] = field(default_factory=dict)
    num_grammars: int = 0  # live grammar states
    counters: dict[str, Any] = field(default_factory=dict)  # LLMEngine.get_stats()

    @property
    def kv_usage(self) -> float:
        """Fraction of the fullest cache group's blocks in use."""
        return max((u / self.kv_blocks_total[g] for g, u in self.kv_blocks_in_use.items()), default=0.0)


@dataclass
class _Update:
    """Step thread -> stream."""

    progress: list[SampleProgress]
    final: RequestOutput | None = None
    error: BaseException | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None


@dataclass
class _Tracked:
    """The step thread's record of a request it serves."""

    request_id: str
    item: ProcessedPrompt
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tracker: ProgressTracker | None = None
    waiting: bool = True


def _put_all(items: list[tuple[asyncio.Queue, _Update]]) -> None:
    for q, update in items:
        q.put_nowait(update)


class RequestStream:
    """Async iterator of one request's :class:`RequestDelta`; reads coalesce everything queued."""

    def __init__(self, owner: AsyncLLM, request_id: str, item: ProcessedPrompt, q: asyncio.Queue):
        self.request_id = request_id
        self.prompt = item.prompt
        self.prompt_token_ids = item.token_ids
        self.params = item.params
        self.finished = False
        self._owner = owner
        self._queue = q
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
            self._owner.abort(self.request_id)

    def _text(self, index: int) -> TextDeltas:
        td = self._texts.get(index)
        if td is None:
            tok = self._owner.engine.tokenizer
            td = self._texts[index] = TextDeltas(tok, self.prompt_token_ids, self.params)
        return td

    def _merge(self, updates: list[_Update]) -> RequestDelta:
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


class AsyncLLM:
    """Owns one :class:`LLMEngine` and the thread that steps it.

    :param max_waiting_requests: submissions beyond this many requests waiting to be scheduled raise
        :class:`QueueFullError` (``None``: no limit).
    :param validation_workers: threads that validate and tokenize prompts.
    """

    def __init__(
        self, engine: LLMEngine, *, max_waiting_requests: int | None = None, validation_workers: int = 2
    ):
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._tracked: dict[str, _Tracked] = {}  # step thread only
        self._lock = threading.Lock()
        self._num_waiting = 0
        self._ids = itertools.count()
        self._stats = EngineStats()
        self._stats_changed = threading.Condition()
        self._dead: BaseException | None = None
        self._validator = ThreadPoolExecutor(validation_workers, thread_name_prefix="deepinfer-validate")
        self._thread = threading.Thread(target=self._run, name="deepinfer-step-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs: Any) -> AsyncLLM:
        if config.data_parallel_size > 1:
            raise ConfigError(
                f"data_parallel_size={config.data_parallel_size} is invalid here: AsyncLLM serves "
                "one engine (data_parallel_size=1)"
            )
        return cls(LLMEngine.from_config(config), **kwargs)

    # ------------------------------------------------------------------ public, any thread / event loop

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def is_alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    async def process(
        self,
        prompts: Any,
        params: SamplingParams | list[SamplingParams] | None = None,
        add_special_tokens: bool = True,
    ) -> list[ProcessedPrompt]:
        """Validate and tokenize in a worker thread (see ``InputProcessor.process``)."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._validator, self.engine.inputs.process, prompts, params, add_special_tokens
        )

    async def run_off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a validation worker: for other CPU work a front does before submitting
        (tokenizing a chat prompt), so it blocks neither the event loop nor the step loop."""
        self._check_alive()
        return await asyncio.get_running_loop().run_in_executor(self._validator, fn, *args)

    def submit(
        self, items: list[ProcessedPrompt], request_ids: list[str] | None = None
    ) -> list[RequestStream]:
        """Queue validated prompts, all or none; call from the event loop that will read the streams.

        :raises QueueFullError: not enough room in the waiting queue for all of them.
        :raises EngineDeadError: the step thread has stopped."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        with self._lock:
            limit = self.max_waiting_requests
            if limit is not None and self._num_waiting + len(items) > limit:
                raise QueueFullError(
                    f"{self._num_waiting} requests are waiting (max_waiting_requests={limit})"
                )
            self._num_waiting += len(items)
        ids = request_ids or [f"async-{next(self._ids)}" for _ in items]
        streams = []
        for item, rid in zip(items, ids, strict=True):
            q: asyncio.Queue = asyncio.Queue()
            self._inbox.put(("add", _Tracked(rid, item, loop, q)))
            streams.append(RequestStream(self, rid, item, q))
        return streams

    async def generate(
        self,
        prompt: Any,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        add_special_tokens: bool = True,
    ) -> RequestStream:
        """Validate and submit one prompt; iterate the returned stream for its outputs."""
        [item] = await self.process(prompt, params, add_special_tokens)
        [stream] = self.submit([item], [request_id] if request_id is not None else None)
        return stream

    def _check_alive(self) -> None:
        if not self.is_alive:
            raise EngineDeadError(f"the engine is not running ({self._dead or 'stopped'})")

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def stats(self) -> EngineStats:
        return self._stats

    def wait_for_stats(self, predicate: Callable[[EngineStats], bool], timeout: float) -> EngineStats:
        """Block until a published snapshot satisfies ``predicate``; raises TimeoutError after ``timeout``."""
        with self._stats_changed:
            if not self._stats_changed.wait_for(lambda: predicate(self._stats), timeout):
                raise TimeoutError(f"engine stats did not reach the expected state: {self._stats}")
            return self._stats

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop the step thread; requests still running fail with :class:`EngineDeadError`."""
        self._inbox.put(("stop", None))
        self._thread.join(timeout)
        self._validator.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the step thread

    def _run(self) -> None:
        try:
            while True:
                cmds = self._commands(block=not self.engine.has_unfinished())
                if any(kind == "stop" for kind, _ in cmds):
                    self._stop(cmds)
                    break
                self._apply(cmds)
                if self.engine.has_unfinished():
                    self._step()
                self._publish_stats()
        except BaseException as e:  # the loop cannot go on: fail everyone, refuse new work
            logger.exception("the engine step loop stopped")
            self._dead = e
            self._fail_all(EngineDeadError(f"the engine stopped: {type(e).__name__}: {e}"), reset=False)
            self._publish_stats()

    def _commands(self, block: bool) -> list[tuple[str, Any]]:
        cmds = [self._inbox.get()] if block else []
        while True:
            try:
                cmds.append(self._inbox.get_nowait())
            except queue.Empty:
                return cmds

    def _stop(self, cmds: list[tuple[str, Any]]) -> None:
        self._dead = EngineDeadError("the engine was shut down")
        for kind, t in cmds:
            if kind == "add":
                self._tracked[t.request_id] = t  # not in the engine: failed below, never aborted there
        self._fail_all(EngineDeadError("the engine is shutting down"), reset=False)
        self._publish_stats()

    def _apply(self, cmds: list[tuple[str, Any]]) -> None:
        aborted = False
        for kind, arg in cmds:
            if kind == "add":
                self._add(arg)
            else:
                self.engine.abort(arg)
                aborted = True
        if aborted:
            self._deliver(self.engine.apply_aborts())

    def _add(self, t: _Tracked) -> None:
        try:
            self.engine.add_request(t.item, t.request_id)
        except Exception as e:  # this request alone fails
            self._unwait(t)
            self._post({t.loop: [(t, _Update([], error=e))]})
            return
        t.tracker = ProgressTracker(self.engine.requests[t.request_id])
        self._tracked[t.request_id] = t

    def _step(self) -> None:
        try:
            outs = self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; failing the %d requests in flight", len(self._tracked))
            self._fail_all(RequestFailedError(f"the engine failed: {type(e).__name__}: {e}"))
            return
        self._deliver(outs)

    def _deliver(self, outs: list[RequestOutput]) -> None:
        """Send every tracked request what it gained in the last step, and finished ones their output."""
        finals = {o.request_id: o for o in outs}
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Tracked, _Update]]] = {}
        for rid, t in list(self._tracked.items()):
            progress = t.tracker.poll()
            final = finals.get(rid)
            if t.waiting and (final is not None or t.tracker.scheduled):
                self._unwait(t)
            if final is not None:
                del self._tracked[rid]
            if progress or final is not None:
                plp = t.tracker.take_prompt_logprobs()
                batches.setdefault(t.loop, []).append((t, _Update(progress, final, prompt_logprobs=plp)))
        self._post(batches)

    def _post(self, batches: dict[asyncio.AbstractEventLoop, list[tuple[_Tracked, _Update]]]) -> None:
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, [(t.queue, u) for t, u in items])
            except RuntimeError:  # that event loop is closed: nobody reads these requests any more
                for t, _ in items:
                    if t.request_id in self._tracked:
                        self.engine.abort(t.request_id)

    def _unwait(self, t: _Tracked) -> None:
        if t.waiting:
            t.waiting = False
            with self._lock:
                self._num_waiting -= 1

    def _fail_all(self, error: BaseException, reset: bool = True) -> None:
        """Fail every tracked request with ``error`` and (with ``reset``) remove them from the engine."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Tracked, _Update]]] = {}
        for t in self._tracked.values():
            self._unwait(t)
            batches.setdefault(t.loop, []).append((t, _Update([], error=error)))
        ids = list(self._tracked)
        self._tracked.clear()
        self._post(batches)
        if reset:
            for rid in ids:
                self.engine.abort(rid)
            self.engine.apply_aborts()
            _drop_orphans(self.engine)

    def _publish_stats(self) -> None:
        kv = self.engine.kv.pools
        stats = EngineStats(
            num_running=sum(not t.waiting for t in self._tracked.values()),
            num_waiting=self._num_waiting,
            kv_blocks_in_use={g: p.num_in_use for g, p in kv.items()},
            kv_blocks_total={g: p.num_blocks for g, p in kv.items()},
            num_grammars=len(self.engine.structured),
            counters=self.engine.get_stats(),
        )
        with self._stats_changed:
            self._stats = stats
            self._stats_changed.notify_all()


def _drop_orphans(engine: LLMEngine) -> None:
    """After a failed step: sequences the scheduler still holds for requests the engine no longer has
    (a step that raised after finishing some of them) are removed and their blocks freed."""
    sched = engine.scheduler
    orphans = [s for s in [*sched.running, *sched.waiting] if s.request.request_id not in engine.requests]
    if orphans:
        sched.abort(orphans)
        for s in orphans:
            engine.outputs.forget(s)
