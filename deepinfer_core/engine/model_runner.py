"""Turn a :class:`SchedulerOutput` into a :class:`ForwardBatch`, run the model, return the wanted logits.

The runner owns the KV pool tensors (one per cache spec, ``[num_blocks + 1, entries_per_block, *entry_shape]``
allocated through ``backends.memory``; the extra last block is scratch that no request owns, where
padded rows of a static step write). :meth:`prepare` is host-only work: it reads token ids and block
tables, builds the batch and the model's :meth:`~deepinfer_core.models.base.CausalLM.plan` on the host,
and copies them to the device, so an overlapping engine can run it for step N+1 while :meth:`run` of step
N is on the device, and the forward pass itself never waits for the host.

Decode steps (one token per sequence, all sampling) of a model that ``supports_graphs`` run *static*:
rows padded to a batch bucket, tables sized by a context bucket. On a platform that captures graphs
(``backends.memory.supports_graphs``) each ``(batch bucket, context bucket)`` is captured once, on first
use, and replayed after copying the step's inputs into the captured buffers.

Logit rows, per scheduled sequence in order: its prompt-logprob positions, then its last row if it
samples. :class:`~deepinfer_core.engine.sampler.Sampler` walks them in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepinfer_core.engine.forward_batch import ForwardBatch
from deepinfer_core.engine.scheduler import ScheduledSeq, SchedulerOutput
from deepinfer_core.kv.budget import KVLayout
from deepinfer_core.models.base import CausalLM
from deepinfer_core.ops.backends import Backends

_PAD = [-1] * 4096


GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 384, 512)
MIN_CONTEXT_BUCKET = 256


@dataclass
class _Graph:
    replay: Callable[[], object]
    inputs: list[torch.Tensor]  # captured input buffers, in ``_graph_inputs`` order
    outputs: list[torch.Tensor]  # the last is the logits buffer [bucket, vocab] that replays refill
    batch: ForwardBatch  # the captured batch: every tensor the graph reads must outlive it


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        backends: Backends,
        layout: KVLayout,
        max_model_len: int | None = None,
        max_graph_batch_size: int = 0,
    ):
        self.model = model
        self.backends = backends
        self.device = backends.memory.device
        self.block_size = layout.block_size
        self.kv: dict[str, torch.Tensor] = {
            s.name: backends.memory.allocate(
                (layout.num_blocks[s.group] + 1, s.entries_per_block(layout.block_size), *s.entry_shape),
                s.dtype,
            )
            for s in model.cache_specs()
        }
        self.groups = sorted(layout.num_blocks)
        self.max_model_len = max_model_len or model.max_position_embeddings
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.graph_batch_sizes: tuple[int, ...] = ()
        self.capture = False
        #: keep the last step's batch and hidden rows (MTP drafting reads them); set by the proposer
        self.keep_hidden = False
        self.last_batch: ForwardBatch | None = None
        self.last_hidden: torch.Tensor | None = None
        if backends.memory.supports_graphs:
            self.static_decode(max_graph_batch_size, capture=True)

    def static_decode(self, max_batch_size: int, capture: bool) -> None:
        """Run decode steps of up to ``max_batch_size`` sequences with static shapes (0: never), captured
        as graphs if ``capture``. Static without capture is what tests use to check the padded path on
        the CPU; it only costs there (padded rows and candidate columns are real work)."""
        ok = max_batch_size > 0 and self.model.supports_graphs
        self.graph_batch_sizes = (
            tuple(b for b in GRAPH_BATCH_SIZES if b < max_batch_size) + (max_batch_size,) if ok else ()
        )
        self.capture = ok and capture

    def prepare(self, sched: SchedulerOutput) -> ForwardBatch:
        scheduled = sched.scheduled
        n_req = len(scheduled)
        decode = sched.num_tokens == n_req and all(s.samples for s in scheduled)
        key = self.graph_key(n_req, max(s.start for s in scheduled)) if decode and n_req else None
        rows = key[0] if key else n_req
        if decode:
            vectors = self._decode_vectors(scheduled, rows)  # one token per sequence
        else:
            vectors = self._mixed_vectors(scheduled)
        sizes = [len(v) for v in vectors]
        flat = torch.tensor([x for v in vectors for x in v], dtype=torch.int64)
        input_ids, positions, qsl, ctx, logit_rows = flat.split(sizes)
        batch = ForwardBatch(
            input_ids=input_ids,
            positions=positions,
            query_start_loc=qsl,
            context_lens=ctx,
            block_tables={g: self._block_table(sched, g, rows) for g in self.groups},
            block_size=self.block_size,
            logits_indices=logit_rows,
        )
        if key is not None:
            batch.graph_key, batch.num_real_rows = key, n_req
        batch.plan = self.model.plan(batch, key[1] if key else None)  # host-side tables and checks
        return batch.to(self.device)

    def graph_key(self, rows: int, max_position: int) -> tuple[int, int] | None:
        """``(batch bucket, context bucket)`` of a decode step of ``rows`` sequences whose last position
        is ``max_position``, or ``None`` when the step runs with dynamic shapes."""
        sizes = self.graph_batch_sizes
        if self.keep_hidden or not sizes or rows > sizes[-1]:
            return None
        context = min(
            max(MIN_CONTEXT_BUCKET, 1 << max_position.bit_length()),
            max(self.max_model_len, MIN_CONTEXT_BUCKET),
        )
        return next(b for b in sizes if b >= rows), context

    @staticmethod
    def _decode_vectors(scheduled: list[ScheduledSeq], rows: int) -> tuple[list[int], ...]:
        """One token per sequence; rows past the sequences are padding (position -1: every slot is -1)."""
        pad = rows - len(scheduled)
        pos = [s.start for s in scheduled] + [-1] * pad
        ids = [s.seq.token_ids[s.start] for s in scheduled] + [0] * pad
        return ids, pos, list(range(rows + 1)), [p + 1 for p in pos], list(range(rows))

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

    def _block_table(self, sched: SchedulerOutput, group: str, rows: int) -> torch.Tensor:
        tables = [s.seq.block_tables.get(group, ()) for s in sched.scheduled]
        tables += [()] * (rows - len(tables))
        width = max(max(map(len, tables), default=0), 1)
        flat: list[int] = []
        for t in tables:
            flat.extend(t)
            if len(t) < width:
                flat.extend(
                    _PAD[: width - len(t)] if width - len(t) <= len(_PAD) else [-1] * (width - len(t))
                )
        return torch.tensor(flat, dtype=torch.int64).view(len(tables), width)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Forward pass; returns float32 logits ``[len(batch.logits_indices), vocab]`` (real rows only)."""
        if batch.graph_key is None:
            return self._forward(batch)
        graph = self.graphs.get(batch.graph_key)
        if graph is None and self.capture:
            graph = self.graphs[batch.graph_key] = self._capture(batch)
        elif graph is not None:
            for dst, src in zip(graph.inputs, self._graph_inputs(batch), strict=True):
                dst.copy_(src, non_blocking=True)
        if graph is None:  # static shapes, but the platform does not capture graphs
            return self._forward(batch)[: batch.num_real_rows]
        graph.replay()
        return graph.outputs[-1][: batch.num_real_rows].clone()

    @staticmethod
    def _graph_inputs(batch: ForwardBatch) -> list[torch.Tensor]:
        """What a static forward reads besides weights and pools: the token ids and the plan's tables."""
        return [batch.input_ids, *batch.plan.tensors()]

    def _capture(self, batch: ForwardBatch) -> _Graph:
        """Capture the forward over ``batch``'s own tensors, which become the graph's input buffers (warm-up
        runs repeat this step's writes with the same values, so they change no state)."""
        out: list[torch.Tensor] = []
        replay = self.backends.memory.capture_graph(lambda: out.append(self._forward(batch)))
        return _Graph(replay, self._graph_inputs(batch), out, batch)

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        hidden = self.model.forward(batch, self.kv)
        if self.keep_hidden:
            self.last_batch, self.last_hidden = batch, hidden
        if batch.logits_indices.numel() == 0:
            return torch.empty(0, self.model.vocab_size, dtype=torch.float32, device=self.device)
        return self.model.compute_logits(hidden[batch.logits_indices]).float()

    def execute(self, sched: SchedulerOutput) -> torch.Tensor:
        return self.run(self.prepare(sched))
