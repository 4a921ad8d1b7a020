"""Continuous batching: which sequences compute how many tokens this step.

FCFS with one token budget (``max_num_batched_tokens``) and a cap on running sequences
(``max_num_seqs``). Running sequences are served first, in admission order; a prompt is cut into chunks
at any token boundary. When a pool runs out of blocks the most recently admitted running sequence is
preempted: its blocks are dropped (the hashed ones stay cached) and it goes back to the front of the
queue to be recomputed; its sampled tokens are kept, so its output does not change. Waiting sequences
are admitted in order while budget and blocks last; a waiting sequence never preempts a running one.

Overlap scheduling. :meth:`schedule` only reads token *counts*, never token values. With overlap
(:mod:`deepinfer_core.engine.overlap`) it runs for step N+1 while step N is on the device: a running
sequence's token sampled by step N is *pending* (``Sequence.num_pending``) and counted as one more token,
whose id the runner takes from the device; a sequence whose pending tokens reach its length limit is not
scheduled (it finishes when they land); a waiting sequence (preempted with a token pending) computes only
the tokens the host knows, and samples again only once that token has landed. The overlapped engine
advances the computed counts at launch (:meth:`advance`) and commits blocks and drops finished
sequences when the step's tokens land (:meth:`retire`); the synchronous engine does both in
:meth:`update`. A sequence that stopped at step N may already be in step N+1: it was counted, its blocks
were allocated, and its extra token is discarded when step N+1 lands.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from deepinfer_core.engine.sequence import SeqStatus, Sequence
from deepinfer_core.kv.kv_manager import KVCacheManager


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # computed tokens before this step
    num_tokens: int  # tokens computed this step
    #: does this step reach the sequence's last token, so a new token is sampled?
    samples: bool = False
    #: prompt positions ``p`` whose next-token distribution is wanted (prompt logprobs), a range
    prompt_logprob_start: int = 0
    prompt_logprob_end: int = 0
    #: draft tokens (``seq.spec_token_ids[:num_drafts]``) computed after the last token, to be verified
    num_drafts: int = 0

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        #: preempted while a token was pending: may finish (when it lands) while waiting
        self._waiting_pending: set[int] = set()

    def add(self, seq: Sequence, front: bool = False) -> None:
        seq.status = SeqStatus.WAITING
        if front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i, allocate = 0, self.kv.allocate
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_pending and seq.ends_with_pending:
                i += 1
                continue
            n = min(seq.num_scheduled_tokens + len(seq.spec_token_ids) - seq.num_computed, budget)
            while not allocate(seq, n):
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.scheduled.append(self._scheduled(seq, n))
                budget -= n
                i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_computed == 0:
                cached = seq.resumed_at = self.kv.match_prefix(seq)
                if seq.sample_index == 0 and seq.request.metrics.first_scheduled_time is None:
                    seq.request.num_cached_tokens = cached
            n = min(seq.num_tokens - seq.num_computed, budget)
            if not self.kv.allocate(seq, n):
                self._reset(seq)
                break
            self.waiting.popleft()
            if seq.request.metrics.first_scheduled_time is None:
                seq.request.metrics.first_scheduled_time = time.perf_counter()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(self._scheduled(seq, n))
            budget -= n

    def _scheduled(self, seq: Sequence, n: int) -> ScheduledSeq:
        start, total = seq.num_computed, seq.num_scheduled_tokens
        drafts = max(0, start + n - total)
        s = ScheduledSeq(seq, start, n, start + n - drafts == total, num_drafts=drafts)
        if seq.params.prompt_logprobs is not None and seq.wants_prompt_logprobs:
            # position p's logits give prompt token p+1's logprob; skip positions already collected
            done = len(seq.request.prompt_logprobs or ()) - 1
            s.prompt_logprob_start = max(s.start, done)
            s.prompt_logprob_end = max(s.prompt_logprob_start, min(s.end, seq.num_prompt_tokens - 1))
        return s

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        if seq.num_pending:
            self._waiting_pending.add(seq.seq_id)
        self._reset(seq)
        self.add(seq, front=True)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def _reset(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.num_computed = 0
        seq.set_drafts([])

    def update(self, out: SchedulerOutput, finished: list[Sequence]) -> None:
        """After the step (synchronous engine): advance computed counts, offer new full blocks to the
        prefix cache, and drop the sequences that finished."""
        for s in out.scheduled:
            seq = s.seq
            end = s.start + s.num_tokens
            if s.num_drafts:  # verified rows: those whose input tokens were accepted
                end = min(end, len(seq.token_ids) - 1)
            if s.samples and seq.spec_token_ids:
                seq.set_drafts([])
            seq.num_computed = end
        self.retire(out, finished)

    def advance(self, out: SchedulerOutput) -> None:
        """At launch (overlapped engine, no drafts): the step's tokens count as computed, and each
        sequence that samples has one more pending token."""
        for s in out.scheduled:
            s.seq.num_computed = s.start + s.num_tokens
            if s.samples:
                s.seq.num_pending += 1

    def retire(self, out: SchedulerOutput, finished: list[Sequence]) -> None:
        """Once the step's tokens are known: offer new full blocks to the prefix cache, and drop the
        sequences that finished (wherever they are) and free their blocks."""
        bs, commit = self.kv.block_size, self.kv.commit
        for s in out.scheduled:
            seq = s.seq
            if min(seq.num_computed, len(seq.token_ids)) // bs > seq.num_committed_blocks:
                commit(seq)  # a block was completed
        if finished:
            done = {id(seq) for seq in finished}
            self.running = [s for s in self.running if id(s) not in done]
            if self._waiting_pending:
                ids = {seq.seq_id for seq in finished} & self._waiting_pending
                if ids:
                    self.waiting = deque(s for s in self.waiting if s.seq_id not in ids)
                    self._waiting_pending -= ids
            for seq in finished:
                self.kv.free(seq)

    def abort(self, seqs: list[Sequence]) -> None:
        """Remove ``seqs`` wherever they are and free their blocks."""
        ids = {id(s) for s in seqs}
        self._waiting_pending.difference_update(s.seq_id for s in seqs)
        self.waiting = deque(s for s in self.waiting if id(s) not in ids)
        self.running = [s for s in self.running if id(s) not in ids]
        for s in seqs:
            self._reset(s)
            s.status = SeqStatus.FINISHED
