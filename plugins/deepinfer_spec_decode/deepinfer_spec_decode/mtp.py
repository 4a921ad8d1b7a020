"""MTP drafting: the checkpoint's multi-token-prediction modules on the target's streams.

After every target step (:meth:`MTPProposer.observe`), module 0 catches up over every row the step
verified: row ``p`` takes the token at ``p + 1`` (prompt token, accepted draft or the just-sampled token)
and the target's streams at ``p``, and writes ``mtp.0.*`` state at ``p``, so the module's sliding window
covers every computed position. The last row's output gives draft 1. Drafts ``2..k`` chain single-token
steps, module ``j % num_mtp_layers`` for draft ``j + 1``, at the lookahead positions ``L - 1, L, ...`` (``L``
tokens); those writes are rewritten by later catch-ups, and their blocks are allocated here (the verify
step needs them anyway). Drafts are the argmax of the draft logits: deterministic given the context, so
the verifier treats them as one-hot (exact for sampling too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from deepinfer_core.config import ConfigError
from deepinfer_core.spec_decode import ForwardBatch, Proposer, SeqStatus

if TYPE_CHECKING:
    from deepinfer_core.spec_decode import SchedulerOutput, Sequence


class MTPProposer(Proposer):
    def __init__(self, model: Any, k: int):
        self.model, self.num_speculative_tokens = model, k
        self.num_modules = model.num_mtp_layers
        #: seq_id -> (position p of its last computed row, module-0 streams at p)
        self._tail: dict[int, tuple[int, torch.Tensor]] = {}

    def bind(self, engine: Any) -> None:
        self.runner, self.kv = engine.runner, engine.kv
        self.runner.keep_hidden = True

    def observe(self, sched: SchedulerOutput) -> None:
        """Module 0 over the rows this step verified, of every sequence still running."""
        batch, hidden = self.runner.last_batch, self.runner.last_hidden
        if batch is None:
            return
        qsl = batch.query_start_loc.tolist()
        seqs, starts, rows, ids = [], [], [], []
        for i, s in enumerate(sched.scheduled):
            seq = s.seq
            n = seq.num_computed - s.start
            if seq.status is not SeqStatus.RUNNING or n <= 0:
                continue
            seqs.append(seq)
            starts.append(s.start)
            rows.extend(range(qsl[i], qsl[i] + n))
            ids.append(seq.token_ids[s.start + 1 : s.start + 1 + n])
        self.runner.last_batch = self.runner.last_hidden = None
        if not seqs:
            return
        rows_t = torch.tensor(rows, dtype=torch.int64, device=hidden.device)
        out = self._step(0, seqs, starts, ids, hidden[rows_t])
        end = 0
        for seq, start, toks in zip(seqs, starts, ids):
            end += len(toks)
            self._tail[seq.seq_id] = (start + len(toks) - 1, out[end - 1])

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        live = {s.seq_id for s in seqs}
        self._tail = {sid: v for sid, v in self._tail.items() if sid in live}
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [i for i, s in enumerate(seqs) if self._tail.get(s.seq_id, (-1,))[0] == s.num_computed - 1]
        if not active:
            return drafts
        limits = list(limits)
        for i in active:  # blocks for the chained steps' lookahead positions
            if limits[i] > 1 and not self.kv.allocate(seqs[i], limits[i]):
                limits[i] = 1
        prev = torch.stack([self._tail[seqs[i].seq_id][1] for i in active])
        tokens = self._argmax(0, prev)
        for i, t in zip(active, tokens):
            drafts[i].append(t)
        for j in range(1, max(limits[i] for i in active)):
            keep = [a for a, i in enumerate(active) if limits[i] > j]
            active = [active[a] for a in keep]
            prev = prev[keep]
            chain = [seqs[i] for i in active]
            starts = [s.num_computed - 1 + j for s in chain]
            ids = [[drafts[i][-1]] for i in active]
            module = j % self.num_modules
            prev = self._step(module, chain, starts, ids, prev)
            for i, t in zip(active, self._argmax(module, prev)):
                drafts[i].append(t)
        return drafts

    def _argmax(self, module: int, streams: torch.Tensor) -> list[int]:
        return torch.argmax(self.model.mtp_compute_logits(module, streams), dim=-1).tolist()

    @torch.inference_mode()
    def _step(
        self,
        module: int,
        seqs: list[Sequence],
        starts: list[int],
        ids: list[list[int]],
        prev: torch.Tensor,
    ) -> torch.Tensor:
        """Module ``module`` over rows ``starts[b] ..`` of sequence ``b`` with next tokens ``ids[b]``."""
        dev = self.runner.device
        flat_ids = [t for toks in ids for t in toks]
        positions = [p for st, toks in zip(starts, ids) for p in range(st, st + len(toks))]
        qsl, ctx = [0], []
        for st, toks in zip(starts, ids):
            qsl.append(qsl[-1] + len(toks))
            ctx.append(st + len(toks))
        batch = ForwardBatch(
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int64, device=dev),
            context_lens=torch.tensor(ctx, dtype=torch.int64, device=dev),
            block_tables={g: _table(seqs, g, dev) for g in self.kv.pools},
            block_size=self.kv.block_size,
        )
        return self.model.mtp_forward(module, batch, prev, self.runner.kv)


def _table(seqs: list[Sequence], group: str, device: torch.device) -> torch.Tensor:
    tables = [s.block_tables.get(group, []) for s in seqs]
    width = max(max(map(len, tables)), 1)
    rows = [t + [-1] * (width - len(t)) for t in tables]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def make_mtp(model: Any, spec: dict[str, Any], config: Any) -> MTPProposer:
    if not getattr(model, "num_mtp_layers", 0):
        raise ConfigError(
            "speculative_config.method='mtp' needs MTP weights, but the checkpoint has no mtp.* tensors "
            "(num_nextn_predict_layers = 0); use method 'ngram' or a checkpoint with MTP modules"
        )
    return MTPProposer(model, spec["num_speculative_tokens"])
