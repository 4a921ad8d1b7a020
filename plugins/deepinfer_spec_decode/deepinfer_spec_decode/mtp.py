"""MTP drafting: the checkpoint's multi-token-prediction modules on the target's streams.

After every target step (:meth:`MTPProposer.observe`), module 0 catches up over every row the step
verified: row ``p`` takes the token at ``p + 1`` (prompt token, accepted draft or the just-sampled token)
and the target's streams at ``p`` (the context's tap), and writes ``mtp.0.*`` state at ``p``, so the
module's sliding window covers every computed position. The last row's output gives draft 1. Drafts
``2..k`` chain single-token steps, module ``j % num_mtp_layers`` for draft ``j + 1``, at the lookahead
positions ``L - 1, L, ...`` (``L`` tokens); those writes are rewritten by later catch-ups, and their blocks
are reserved here (the verify step needs them anyway). Every step is one :meth:`ProposerContext.run` of
the same function, so it replays a captured graph per shape bucket like a decode step. Drafts are the
argmax of the draft logits: deterministic given the context, so the verifier treats them as one-hot
(exact for sampling too).
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_core.plugin_api import (
    ConfigError,
    DraftSequence,
    ForwardBatch,
    Proposer,
    ProposerContext,
    VerifiedRows,
)


class MTPProposer(Proposer):
    needs_hidden = True

    def __init__(self, model: Any, k: int):
        self.model, self.num_speculative_tokens = model, k
        self.num_modules = model.num_mtp_layers
        #: seq_id -> (position p of its last computed row, module-0 streams at p, draft 1)
        self._tail: dict[int, tuple[int, torch.Tensor, int]] = {}

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
        streams, tokens = self._run(0, batch, hidden, src, [len(x) for x in ids])
        for b, r in enumerate(rows):
            self._tail[r.seq.seq_id] = (r.start + r.num_verified - 1, streams[b], tokens[b])

    def propose(self, seqs: list[DraftSequence], limits: list[int]) -> list[list[int]]:
        live = {s.seq_id for s in seqs}
        self._tail = {sid: v for sid, v in self._tail.items() if sid in live}
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [i for i, s in enumerate(seqs) if self._tail.get(s.seq_id, (-1,))[0] == s.num_computed - 1]
        if not active:
            return drafts
        limits = list(limits)
        for i in active:  # blocks for the chained steps' lookahead positions
            if limits[i] > 1 and not self.ctx.reserve(seqs[i], limits[i]):
                limits[i] = 1
        for i in active:
            drafts[i].append(self._tail[seqs[i].seq_id][2])
        prev = torch.stack([self._tail[seqs[i].seq_id][1] for i in active])
        for j in range(1, max(limits[i] for i in active)):
            keep = [a for a, i in enumerate(active) if limits[i] > j]
            active, prev = [active[a] for a in keep], prev[keep]
            chain = [seqs[i] for i in active]
            batch = self.ctx.draft_batch(
                chain, [s.num_computed - 1 + j for s in chain], [[drafts[i][-1]] for i in active]
            )
            prev, tokens = self._run(
                j % self.num_modules, batch, prev, list(range(len(active))), [1] * len(active)
            )
            for i, t in zip(active, tokens):
                drafts[i].append(t)
        return drafts

    def _run(
        self, module: int, batch: ForwardBatch, source: torch.Tensor, src_rows: list[int], counts: list[int]
    ) -> tuple[torch.Tensor, list[int]]:
        """Module ``module`` over ``batch`` with input streams ``source[src_rows]`` laid out as the batch's rows;
        returns each sequence's streams at its last row and the argmax draft from them."""
        rows = batch.input_ids.shape[0]
        q = rows // max(batch.query_start_loc.shape[0] - 1, 1) if batch.graph_key is not None else None
        gather, last = _layout(src_rows, counts, rows, q)
        dev = source.device
        prev = source.index_select(0, torch.tensor(gather, dtype=torch.int64, device=dev))
        last_t = torch.tensor(last, dtype=torch.int64, device=dev)
        streams, tokens = self.ctx.run(module, self._step(module), batch, prev, last_t)
        n = len(counts)
        return streams[:n].clone(), tokens[:n].tolist()

    def _step(self, module: int):
        model = self.model

        def step(
            batch: ForwardBatch, prev: torch.Tensor, last: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            out = model.mtp_forward(module, batch, prev, self.ctx.pools())
            tail = out.index_select(0, last)
            return tail, torch.argmax(model.mtp_compute_logits(module, tail), dim=-1)

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
    return MTPProposer(model, spec["num_speculative_tokens"])
