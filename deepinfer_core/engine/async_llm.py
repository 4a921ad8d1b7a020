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
import json
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from deepinfer_core.config import ConfigError, EngineConfig
from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.engine.outputs import RequestOutput
from deepinfer_core.engine.request_stream import (
    CompletionDelta,
    EngineDeadError,
    QueueFullError,
    RequestDelta,
    RequestFailedError,
    RequestStream,
    StreamUpdate,
)
from deepinfer_core.engine.streaming import ProgressTracker
from deepinfer_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from deepinfer_core.chat import ChatEncoding

logger = logging.getLogger(__name__)


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
class _Tracked:
    """The step thread's record of a request it serves."""

    request_id: str
    item: ProcessedPrompt
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tracker: ProgressTracker | None = None
    waiting: bool = True


def _put_all(items: list[tuple[asyncio.Queue, StreamUpdate]]) -> None:
    for q, update in items:
        q.put_nowait(update)


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
        self._stats_seq = 0  # snapshots published so far
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

    @cached_property
    def chat_encoding(self) -> ChatEncoding:
        """The checkpoint's chat encoding, from its config.json (as ``LLM.chat_encoding``)."""
        from deepinfer_core.chat import encoding_for_config
        from deepinfer_core.engine.loader import checkpoint_path

        path = checkpoint_path(self.engine.config) / "config.json"
        return encoding_for_config(json.loads(path.read_text()))

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
        self,
        items: list[ProcessedPrompt],
        request_ids: list[str] | None = None,
        *,
        max_waiting_requests: int | None = None,
    ) -> list[RequestStream]:
        """Queue validated prompts, all or none; call from the event loop that will read the streams.
        ``max_waiting_requests`` lets a front impose a tighter limit than the AsyncLLM's own.

        :raises QueueFullError: not enough room in the waiting queue for all of them.
        :raises EngineDeadError: the step thread has stopped."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        limits = [x for x in (self.max_waiting_requests, max_waiting_requests) if x is not None]
        with self._lock:
            limit = min(limits, default=None)
            if limit is not None and self._num_waiting + len(items) > limit:
                raise QueueFullError(
                    f"{self._num_waiting} requests are waiting (max_waiting_requests={limit})"
                )
            self._num_waiting += len(items)
        ids = request_ids or [f"async-{next(self._ids)}" for _ in items]
        tracked = [_Tracked(rid, item, loop, asyncio.Queue()) for item, rid in zip(items, ids, strict=True)]
        self._inbox.put(("add", tracked))
        return [
            RequestStream(t.request_id, t.item, t.queue, self.engine.tokenizer, self.abort) for t in tracked
        ]

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
        """Block until a snapshot published after this call (so after everything submitted or aborted
        before it has been applied) satisfies ``predicate``; raises TimeoutError after ``timeout``."""
        with self._stats_changed:
            seq = self._stats_seq
        if self.is_alive:
            self._inbox.put(("sync", None))  # the step thread publishes once more, even when idle
        else:
            seq -= 1
        with self._stats_changed:
            if not self._stats_changed.wait_for(
                lambda: self._stats_seq > seq and predicate(self._stats), timeout
            ):
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
        for kind, group in cmds:
            if kind == "add":  # not in the engine: failed below, never aborted there
                self._tracked.update((t.request_id, t) for t in group)
        self._fail_all(EngineDeadError("the engine is shutting down"), reset=False)
        self._publish_stats()

    def _apply(self, cmds: list[tuple[str, Any]]) -> None:
        aborted = False
        for kind, arg in cmds:
            if kind == "add":
                self._add(arg)
            elif kind == "abort":
                self.engine.abort(arg)
                aborted = True
        if aborted:
            self._deliver(self.engine.apply_aborts())

    def _add(self, group: list[_Tracked]) -> None:
        """One submission's requests, queued all or none; if they cannot be, they alone fail."""
        try:
            self.engine.add_requests([t.item for t in group], [t.request_id for t in group])
        except Exception as e:
            for t in group:
                self._unwait(t)
            self._post({group[0].loop: [(t, StreamUpdate([], error=e)) for t in group]})
            return
        for t in group:
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
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Tracked, StreamUpdate]]] = {}
        for rid, t in list(self._tracked.items()):
            progress = t.tracker.poll()
            final = finals.get(rid)
            if t.waiting and (final is not None or t.tracker.scheduled):
                self._unwait(t)
            if final is not None:
                del self._tracked[rid]
            if progress or final is not None:
                plp = t.tracker.take_prompt_logprobs()
                batches.setdefault(t.loop, []).append((t, StreamUpdate(progress, final, prompt_logprobs=plp)))
        self._post(batches)

    def _post(self, batches: dict[asyncio.AbstractEventLoop, list[tuple[_Tracked, StreamUpdate]]]) -> None:
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
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Tracked, StreamUpdate]]] = {}
        for t in self._tracked.values():
            self._unwait(t)
            batches.setdefault(t.loop, []).append((t, StreamUpdate([], error=error)))
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
            self._stats_seq += 1
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


__all__ = [
    "AsyncLLM",
    "CompletionDelta",
    "EngineDeadError",
    "EngineStats",
    "QueueFullError",
    "RequestDelta",
    "RequestFailedError",
    "RequestStream",
]
