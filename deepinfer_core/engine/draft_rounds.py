"""Draft round bookkeeping: which sequences get drafts after a step, and how many."""

from __future__ import annotations

import torch

from deepinfer_core.engine.scheduler import SchedulerOutput
from deepinfer_core.engine.sequence import SeqStatus, Sequence
from deepinfer_core.spec_decode import Draft, Proposer, VerifiedRows


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
    disable_above: int | None = None,
) -> bool:
    """After a step: let the proposer see it, then store drafts on every decoding running sequence
    (all tokens but the last computed); the others keep none. With more than ``disable_above`` running
    sequences (``speculative_config.disable_by_batch_size``) nobody gets drafts this round: the next step is
    plain decode, while the proposer still sees every step, so drafting resumes as soon as the batch shrinks.
    Returns whether drafting ran."""
    proposer.observe(verified_rows(sched, first_rows))
    k = proposer.num_speculative_tokens
    seqs, limits = [], []
    if disable_above is not None and len(running) > disable_above:
        for seq in running:
            seq.set_drafts([])
        return False
    for seq in running:
        seq.set_drafts([])
        if seq.num_computed == len(seq.token_ids) - 1 and seq.finish_reason is None:
            limit = draft_limit(seq, k, max_model_len)
            if limit > 0:
                seqs.append(seq)
                limits.append(limit)
    if seqs:
        for seq, limit, drafts in zip(seqs, limits, proposer.propose(seqs, limits)):
            if isinstance(drafts, Draft):
                seq.set_drafts(list(drafts.token_ids[:limit]), _draft_probs(drafts, limit))
            else:
                seq.set_drafts(list(drafts[:limit]))
    return True


def _draft_probs(draft: Draft, limit: int) -> torch.Tensor | None:
    """The proposer's ``q`` for the drafts kept, checked: one row per draft, each draft possible under its
    row. None when every row is one-hot at its draft, which is the deterministic-draft case exactly
    (the verifier then draws exactly as plain sampling does)."""
    ids = list(draft.token_ids[:limit])
    if draft.probs is None or not ids:
        return None
    q = draft.probs[: len(ids)]
    if q.dim() != 2 or q.shape[0] != len(ids):
        raise ValueError(f"a Draft's probs must be [{len(ids)}, V] for its tokens, got {tuple(q.shape)}")
    at = q.gather(1, torch.tensor(ids, dtype=torch.int64, device=q.device)[:, None]).flatten().tolist()
    if min(at) <= 0:
        raise ValueError("a Draft's token has probability 0 under its own probs: it was not drawn from them")
    return None if min(at) == 1.0 else q
