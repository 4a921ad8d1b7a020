"""Overlap scheduling: the host prepares step N+1 and processes step N-1 while the device runs step N.

One step is in flight at a time. :meth:`OverlapLoop.step` schedules and launches the next step (prepare,
forward, sampling: all queued on the device; the sampled tokens stay there, in the persistent batch's
token rows, and a copy to the host is started), and only then *lands* the step before it: waits for
that copy, appends the tokens, checks stop conditions, commits blocks and returns finished requests.
On a device with a stream the host never waits for the step it just launched; on the CPU reference
platform the "device" is the CPU, so nothing runs at the same time, but the bookkeeping is the same and
the tests run it there.

Why it is exact (the same tokens as the synchronous loop, with the same seeds):

- The scheduler reads counts only; a token that is sampled but not landed is *pending* and counted. The
  next step reads its id on the device (:meth:`ModelRunner.prepare`).
- A sequence that stopped at step N (EOS, stop token or string, a grammar's end) is found out when step
  N lands, after step N+1 was launched with it: its KV for step N+1 was allocated (and is freed when it
  finishes), and the token step N+1 sampled for it is discarded when N+1 lands. A sequence whose
  pending tokens reach ``max_tokens`` or ``max_model_len`` is known to stop and is not scheduled.
- Its sampling only advances its own generator (per-sequence seeds), so a discarded token never shifts
  another sequence's draws, and ``min_tokens`` counts pending tokens (``Sequence.num_sampled_outputs``).
- Aborts land the step in flight first, so an aborted request reports the same tokens as without
  overlap. A sequence preempted with a token pending keeps it (it lands while the sequence waits) and
  is recomputed from the tokens the host knows.
- Whatever needs the previous token's *value* on the host before it can run the next step runs without
  overlap: structured output (the grammar accepts the token before the next bitmask), penalties (output
  token counts), and speculative decoding (drafts are proposed from landed tokens and verified on the
  host). While such a sequence is live, :class:`~deepinfer_core.engine.llm_engine.LLMEngine` lands the
  step in flight and steps synchronously.
- A launch that raises lands the step in flight and falls back to the synchronous step, which retries
  each sequence alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from deepinfer_core.engine.model_runner import ModelRunner
from deepinfer_core.engine.output_processor import OutputProcessor
from deepinfer_core.engine.outputs import RequestOutput
from deepinfer_core.engine.sampler import PendingSamples, Sampler
from deepinfer_core.engine.scheduler import Scheduler, SchedulerOutput
from deepinfer_core.engine.sequence import SeqStatus


class EngineParts(Protocol):
    """What the loop uses of :class:`~deepinfer_core.engine.llm_engine.LLMEngine` (named here, not imported: the
    engine imports this module)."""

    runner: ModelRunner
    sampler: Sampler
    scheduler: Scheduler
    outputs: OutputProcessor
    requests: dict
    isolate_failures: bool

    def apply_aborts(self) -> list[RequestOutput]: ...
    def _stuck(self) -> list[RequestOutput]: ...
    def _sync_step(self) -> list[RequestOutput]: ...
    def _fail(self, failed: Any) -> list[RequestOutput]: ...
    def _post_step(self, sched: SchedulerOutput) -> list[RequestOutput]: ...
    def _collect(self, finished: Any) -> list[RequestOutput]: ...


@dataclass
class InFlight:
    sched: SchedulerOutput
    samples: PendingSamples


class OverlapLoop:
    def __init__(self, engine: EngineParts):
        self.engine = engine
        self.inflight: InFlight | None = None

    def step(self) -> list[RequestOutput]:
        e = self.engine
        outs = e.apply_aborts()
        sched = e.scheduler.schedule()
        if sched.is_empty:
            return outs + (self.land() if self.inflight else e._stuck())
        try:
            launched = self.launch(sched)
        except Exception:
            if not e.isolate_failures:
                raise
            return outs + self.land() + e._sync_step()  # the synchronous step retries each sequence alone
        outs += self.land()
        self.inflight = launched
        if not e.requests:  # everything ended: what is in flight is all discarded, land it now
            outs += self.land()
        return outs

    def launch(self, sched: SchedulerOutput) -> InFlight:
        """Queue the step on the device; its sampled tokens become pending."""
        e = self.engine
        runner = e.runner
        logits = runner.run(runner.prepare(sched))
        pb = runner.batch
        drawn = [
            s for s in sched.scheduled if s.samples
        ]  # (no draft rounds: those steps run without overlap)
        rows, at = [pb.row_of[s.seq.seq_id] for s in drawn], [s.end for s in drawn]
        samples = e.sampler.launch(
            logits, sched, pb.sampling_tensors(rows, logits.device, at) if rows else None
        )
        if samples.tokens is not None:
            runner.store_tokens(samples.seqs, samples.tokens)
        e.scheduler.advance(sched)
        return InFlight(sched, samples)

    def land(self) -> list[RequestOutput]:
        """Learn the tokens of the step in flight (if any) and process them; returns finished requests."""
        f, self.inflight = self.inflight, None
        if f is None:
            return []
        e, sched = self.engine, f.sched
        out = f.samples.result()
        for i, s in enumerate(sched.scheduled):
            if s.samples:
                s.seq.num_pending -= 1
            if s.seq.status is SeqStatus.FINISHED:  # it stopped one step earlier, or was ended
                out.tokens[i] = None
                out.prompt.pop(i, None)
        finished, failed = e.outputs.append(sched, out)
        e.scheduler.retire(sched, finished)
        errors = e._fail(failed) + e._post_step(sched)
        return errors + e._collect(finished)
