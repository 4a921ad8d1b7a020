"""Draft round bookkeeping: which sequences get drafts after a step, and how many."""

from __future__ import annotations

from deepinfer_core.engine.scheduler import SchedulerOutput
from deepinfer_core.engine.sequence import SeqStatus, Sequence
from deepinfer_core.spec_decode import Proposer, VerifiedRows


def draft_limit(seq: Sequence, k: int, max_model_len: int) -> int:
    """Drafts ``seq`` may carry: a round emits up to ``drafts + 1`` tokens, which must fit ``max_tokens``
    and ``max_model_len``."""
    return min(k, seq.max_tokens - seq.num_output_tokens - 1, max_model_len - len(seq.token_ids) - 1)


def verified_rows(sched: SchedulerOutput, first_rows: list[int]) -> list[VerifiedRows]:
    """The rows the step verified of each sequence still running (``first_rows[i]``: the first row of
    scheduled sequence ``i`` in the step's hidden states)."""
    out = []
    for s, row in zip(sched.scheduled, first_rows, strict=True):
        seq = s.seq
        n = seq.num_computed - s.start
        if seq.status is SeqStatus.RUNNING and n > 0:
            out.append(VerifiedRows(seq, s.start, n, row))
    return out


def draft_round(
    proposer: Proposer,
    sched: SchedulerOutput,
    first_rows: list[int],
    running: list[Sequence],
    max_model_len: int,
) -> None:
    """After a step: let the proposer see it, then store drafts on every decoding running sequence
    (all tokens but the last computed); the others keep none."""
    proposer.observe(verified_rows(sched, first_rows))
    k = proposer.num_speculative_tokens
    seqs, limits = [], []
    for seq in running:
        seq.spec_token_ids = []
        if seq.num_computed == len(seq.token_ids) - 1 and seq.finish_reason is None:
            limit = draft_limit(seq, k, max_model_len)
            if limit > 0:
                seqs.append(seq)
                limits.append(limit)
    if seqs:
        for seq, limit, drafts in zip(seqs, limits, proposer.propose(seqs, limits)):
            seq.spec_token_ids = list(drafts[:limit])
