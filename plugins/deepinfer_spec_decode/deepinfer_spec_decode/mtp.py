"""MTP drafting: the checkpoint's multi-token-prediction modules on the target's streams.

After every target step (:meth:`MTPProposer.observe`), module 0 catches up over every row the step
verified: row ``p`` takes the token at ``p + 1`` (prompt token, accepted draft or the just-sampled token)
and the target's streams at ``p`` (the context's tap), and writes ``mtp.0.*`` state at ``p``, so the
module's sliding window covers every computed position. The last row's output gives draft 1. Drafts
``2..k`` chain single-token steps, module ``j % num_mtp_layers`` for draft ``j + 1``, at the lookahead
positions ``L - 1, L, ...`` (``L`` tokens); those writes are rewritten by later catch-ups, and their blocks
are reserved here (the verify step needs them anyway). Every step is one :meth:`ProposerContext.run` of
the same function, so it replays a captured graph per shape bucket like a decode step.

Greedy requests draft the argmax of the draft logits (one-hot ``q``). A sampling request drafts by
sampling (``draft_sampling="sample"``, the default): each draft is drawn, with the sequence's draft
generator, from the draft logits under the request's temperature, top-k, top-p and min-p, and that
distribution is returned as the draft's ``q`` (:class:`Draft`), so the verifier accepts with
``min(1, p/q)``. ``draft_sampling="greedy"`` drafts the argmax for every request: the verifier then draws
exactly as plain sampling does, so a seeded request emits the tokens of a run without speculation.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_core.plugin_api import (
    ConfigError,
    Draft,
    DraftSequence,
    ForwardBatch,
    Proposer,
    ProposerContext,
    VerifiedRows,
)


class MTPProposer(Proposer):
    needs_hidden = True

    def __init__(self, model: Any, k: int, sample_drafts: bool = True):
        self.model, self.num_speculative_tokens = model, k
        self.num_modules = model.num_mtp_layers
        self.sample_drafts = sample_drafts
        #: seq_id -> (position p of its last computed row, module-0 streams at p, argmax draft, logits at p)
        self._tail: dict[int, tuple[int, torch.Tensor, int, torch.Tensor]] = {}

    def bind(self, ctx: ProposerContext) -> None:
        self.ctx = ctx

    def observe(self, rows: list[VerifiedRows]) -> None:
        """Module 0 over the rows the last step verified, of every sequence still running."""
        hidden = self.ctx.last_hidden()
        if hidden is None or not rows:
            return
        ids = [r.seq.token_ids[r.start + 1 : r.start + 1 + r.num_verified] for r in rows]
        batch = self.ctx.draft_batch([r.seq for r in rows], [r.start for r in rows], ids)
        src = [r.row + j for r in rows for j in range(r.num_verified)]
        streams, tokens, logits = self._run(0, batch, hidden, src, [len(x) for x in ids])
        for b, r in enumerate(rows):
            self._tail[r.seq.seq_id] = (r.start + r.num_verified - 1, streams[b], tokens[b], logits[b])

    def propose(self, seqs: list[DraftSequence], limits: list[int]) -> list[list[int] | Draft]:
        live = {s.seq_id for s in seqs}
        self._tail = {sid: v for sid, v in self._tail.items() if sid in live}
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [i for i, s in enumerate(seqs) if self._tail.get(s.seq_id, (-1,))[0] == s.num_computed - 1]
        if not active:
            return list(drafts)
        limits = list(limits)
        for i in active:  # blocks for the chained steps' lookahead positions
            if limits[i] > 1 and not self.ctx.reserve(seqs[i], limits[i]):
                limits[i] = 1
        tails = [self._tail[seqs[i].seq_id] for i in active]
        q: list[list[torch.Tensor]] = [[] for _ in seqs]
        self._pick(seqs, active, [t[2] for t in tails], torch.stack([t[3] for t in tails]), drafts, q)
        prev = torch.stack([t[1] for t in tails])
        for j in range(1, max(limits[i] for i in active)):
            keep = [a for a, i in enumerate(active) if limits[i] > j]
            active, prev = [active[a] for a in keep], prev[keep]
            chain = [seqs[i] for i in active]
            batch = self.ctx.draft_batch(
                chain, [s.num_computed - 1 + j for s in chain], [[drafts[i][-1]] for i in active]
            )
            prev, tokens, logits = self._run(
                j % self.num_modules, batch, prev, list(range(len(active))), [1] * len(active)
            )
            self._pick(seqs, active, tokens, logits, drafts, q)
        return [Draft(d, torch.stack(qi)) if qi else d for d, qi in zip(drafts, q)]

    def _pick(
        self,
        seqs: list[DraftSequence],
        active: list[int],
        argmax: list[int],
        logits: torch.Tensor,
        drafts: list[list[int]],
        q: list[list[torch.Tensor]],
    ) -> None:
        """Append the next draft of each sequence ``active[a]`` (its draft logits: row ``a``): the argmax, or
        for a sampling request (with ``sample_drafts``) a token drawn from the request's distribution over
        the logits, whose row is appended to ``q``."""
        sampled = [a for a, i in enumerate(active) if self.sample_drafts and not seqs[i].params.greedy]
        for a, i in enumerate(active):
            drafts[i].append(argmax[a])
        if not sampled:
            return
        who = [seqs[active[a]] for a in sampled]
        probs = self.ctx.draft_probs(who, logits[sampled])
        for a, t, row in zip(sampled, self.ctx.draw(who, probs), probs):
            drafts[active[a]][-1] = t
            q[active[a]].append(row)

    def _run(
        self, module: int, batch: ForwardBatch, source: torch.Tensor, src_rows: list[int], counts: list[int]
    ) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        """Module ``module`` over ``batch`` with input streams ``source[src_rows]`` laid out as the batch's rows;
        returns each sequence's streams at its last row, the argmax draft from them and the draft logits."""
        rows = batch.input_ids.shape[0]
        q = rows // max(batch.query_start_loc.shape[0] - 1, 1) if batch.graph_key is not None else None
        gather, last = _layout(src_rows, counts, rows, q)
        dev = source.device
        prev = source.index_select(0, torch.tensor(gather, dtype=torch.int64, device=dev))
        last_t = torch.tensor(last, dtype=torch.int64, device=dev)
        streams, tokens, logits = self.ctx.run(module, self._step(module), batch, prev, last_t)
        n = len(counts)
        return streams[:n].clone(), tokens[:n].tolist(), logits[:n].clone()

    def _step(self, module: int):
        model = self.model

        def step(
            batch: ForwardBatch, prev: torch.Tensor, last: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            out = model.mtp_forward(module, batch, prev, self.ctx.pools())
            tail = out.index_select(0, last)
            logits = model.mtp_compute_logits(module, tail)
            return tail, torch.argmax(logits, dim=-1), logits

        return step


def _layout(src_rows: list[int], counts: list[int], rows: int, q: int | None) -> tuple[list[int], list[int]]:
    """Where each batch row takes its input streams from (padding rows: row 0), and each sequence's (and
    each padding sequence's) last row. Static batches give sequence ``b`` rows ``b*q ..``; dynamic ones
    pack them."""
    gather = [src_rows[0] if src_rows else 0] * rows
    last: list[int] = []
    k = base = 0
    for n in counts:
        for j in range(n):
            gather[base + j] = src_rows[k + j]
        last.append(base + n - 1)
        k += n
        base = base + (q if q is not None else n)
    if q is not None:
        last += [b * q for b in range(len(counts), rows // q)]
    return gather, last


def make_mtp(model: Any, spec: dict[str, Any], config: Any) -> MTPProposer:
    if not getattr(model, "num_mtp_layers", 0):
        raise ConfigError(
            "speculative_config.method='mtp' needs MTP weights, but the checkpoint has no mtp.* tensors "
            "(num_nextn_predict_layers = 0); use method 'ngram' or a checkpoint with MTP modules"
        )
    mode = spec.get("draft_sampling", "sample")
    if mode not in ("sample", "greedy"):
        raise ConfigError(f"speculative_config.draft_sampling={mode!r} is invalid: 'sample' or 'greedy'")
    return MTPProposer(model, spec["num_speculative_tokens"], sample_drafts=mode == "sample")
