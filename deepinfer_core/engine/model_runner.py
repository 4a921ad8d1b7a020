"""Turn a :class:`SchedulerOutput` into a :class:`ForwardBatch`, run the model, return the wanted logits.

The runner owns the KV pool tensors (one per cache spec, ``[num_blocks, entries_per_block, *entry_shape]``
allocated through ``backends.memory``). :meth:`prepare` is host-only work (it reads token ids and block
tables), so an overlapping engine can run it for step N+1 while :meth:`run` of step N is on the device.

Logit rows, per scheduled sequence in order: its prompt-logprob positions, then its last row if it
samples. :class:`~deepinfer_core.engine.sampler.Sampler` walks them in the same order.
"""

from __future__ import annotations

import torch

from deepinfer_core.engine.forward_batch import ForwardBatch
from deepinfer_core.engine.scheduler import ScheduledSeq, SchedulerOutput
from deepinfer_core.kv.budget import KVLayout
from deepinfer_core.models.base import CausalLM
from deepinfer_core.ops.backends import Backends

_PAD = [-1] * 4096


class ModelRunner:
    def __init__(self, model: CausalLM, backends: Backends, layout: KVLayout):
        self.model = model
        self.backends = backends
        self.device = backends.memory.device
        self.block_size = layout.block_size
        self.kv: dict[str, torch.Tensor] = {
            s.name: backends.memory.allocate(
                (layout.num_blocks[s.group], s.entries_per_block(layout.block_size), *s.entry_shape), s.dtype
            )
            for s in model.cache_specs()
        }
        self.groups = sorted(layout.num_blocks)
        #: keep the last step's batch and hidden rows (MTP drafting reads them); set by the proposer
        self.keep_hidden = False
        self.last_batch: ForwardBatch | None = None
        self.last_hidden: torch.Tensor | None = None

    def prepare(self, sched: SchedulerOutput) -> ForwardBatch:
        scheduled = sched.scheduled
        n_req = len(scheduled)
        if sched.num_tokens == n_req and all(s.samples for s in scheduled):
            vectors = self._decode_vectors(scheduled)  # the common case: one token per sequence
        else:
            vectors = self._mixed_vectors(scheduled)
        # one host tensor for all index vectors, one copy to the device
        sizes = [len(v) for v in vectors]
        flat = torch.tensor([x for v in vectors for x in v], dtype=torch.int64).to(self.device)
        input_ids, positions, qsl, ctx, rows = flat.split(sizes)
        return ForwardBatch(
            input_ids=input_ids,
            positions=positions,
            query_start_loc=qsl,
            context_lens=ctx,
            block_tables={g: self._block_table(sched, g) for g in self.groups},
            block_size=self.block_size,
            logits_indices=rows,
        )

    @staticmethod
    def _decode_vectors(scheduled: list[ScheduledSeq]) -> tuple[list[int], ...]:
        pos = [s.start for s in scheduled]
        ids = [s.seq.token_ids[s.start] for s in scheduled]
        n = len(scheduled)
        return ids, pos, list(range(n + 1)), [p + 1 for p in pos], list(range(n))

    @staticmethod
    def _mixed_vectors(scheduled: list[ScheduledSeq]) -> tuple[list[int], ...]:
        ids: list[int] = []
        positions: list[int] = []
        qsl = [0]
        ctx: list[int] = []
        rows: list[int] = []
        for s in scheduled:
            base, start, end = qsl[-1], s.start, s.start + s.num_tokens
            ids.extend(s.seq.token_ids[start:end])
            if s.num_drafts:
                ids.extend(s.seq.spec_token_ids[: s.num_drafts])
            positions.extend(range(start, end))
            qsl.append(base + s.num_tokens)
            ctx.append(end)
            rows.extend(range(base + s.prompt_logprob_start - start, base + s.prompt_logprob_end - start))
            if s.samples:
                rows.extend(range(base + s.num_tokens - 1 - s.num_drafts, base + s.num_tokens))
        return ids, positions, qsl, ctx, rows

    def _block_table(self, sched: SchedulerOutput, group: str) -> torch.Tensor:
        tables = [s.seq.block_tables.get(group, ()) for s in sched.scheduled]
        width = max(max(map(len, tables), default=0), 1)
        flat: list[int] = []
        for t in tables:
            flat.extend(t)
            if len(t) < width:
                flat.extend(
                    _PAD[: width - len(t)] if width - len(t) <= len(_PAD) else [-1] * (width - len(t))
                )
        return torch.tensor(flat, dtype=torch.int64).view(len(tables), width).to(self.device)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Forward pass; returns float32 logits ``[len(batch.logits_indices), vocab]``."""
        hidden = self.model.forward(batch, self.kv)
        if self.keep_hidden:
            self.last_batch, self.last_hidden = batch, hidden
        if batch.logits_indices.numel() == 0:
            return torch.empty(0, self.model.vocab_size, dtype=torch.float32, device=self.device)
        return self.model.compute_logits(hidden[batch.logits_indices]).float()

    def execute(self, sched: SchedulerOutput) -> torch.Tensor:
        return self.run(self.prepare(sched))
