"""Turn a :class:`SchedulerOutput` into a :class:`ForwardBatch`, run the model, return the wanted logits.

The runner owns the KV pool tensors (one per cache spec, ``[num_blocks + 1, entries_per_block, *entry_shape]``
allocated through ``backends.memory``; the extra last block is scratch that no request owns, where
padded rows of a static step write). :meth:`prepare` is host-only work: it reads token ids and block
tables, builds the batch and the model's :meth:`~deepinfer_core.models.base.CausalLM.plan` on the host,
and copies them to the device, so an overlapping engine can run it for step N+1 while :meth:`run` of step
N is on the device, and the forward pass itself never waits for the host.

Static steps. A step where every sequence computes the same number ``q`` of rows and samples from each
(a decode step: ``q = 1``; a verify step: its last token and ``q - 1`` drafts each, fewer drafts padded
with rows at position -1) of a model that ``supports_graphs`` runs *static*: sequences padded to a batch
bucket, tables sized by a context bucket. On a platform that captures graphs
(``backends.memory.supports_graphs``) each ``(batch bucket, context bucket, q)`` is captured once, on first
use, and replayed after copying the step's inputs into the captured buffers. Draft steps of a proposer
use the same machinery through :meth:`run_static` (see :mod:`.proposer_context`).

The tap. With ``tap_hidden`` set (a proposer needs the target's hidden states), every step keeps its
hidden rows in :attr:`last_hidden`, a graph output when the step was replayed, and :attr:`last_rows`
(the first row of each scheduled sequence), so speculative decoding never turns graphs off.

The persistent batch (:mod:`.persistent_batch`) keeps each running sequence's block tables and its last
sampled token in rows that are updated when they change. A step's input id at a sequence's pending
position (overlap scheduling: sampled by the step before, not yet known to the host) is taken from that
row's token on the device, after the batch is copied there and before the forward pass, so building the
next step never waits for the current one.

Logit rows, per scheduled sequence in order: its prompt-logprob positions, then its last row (and its
draft rows) if it samples. :class:`~deepinfer_core.engine.sampler.Sampler` walks them in the same order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from deepinfer_core.engine.graphs import GraphCache
from deepinfer_core.engine.images import step_images
from deepinfer_core.engine.layer_range import BoundedReplay, tail_batch
from deepinfer_core.engine.persistent_batch import PersistentBatch
from deepinfer_core.engine.scheduler import ScheduledSeq, SchedulerOutput
from deepinfer_core.kv.budget import KVLayout
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch, move_together
from deepinfer_core.ops.backends import Backends

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 384, 512)
MIN_CONTEXT_BUCKET = 256
#: most rows a sequence computes in a static step (a decode, verify or draft step); a step with more (a draft
#: head catching up on a whole prompt) runs with dynamic shapes rather than as one graph per row count
MAX_STATIC_ROWS_PER_SEQ = 16


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
        self.batch = PersistentBatch(self.groups, -(-self.max_model_len // self.block_size) + 1, self.device)
        self.graphs = GraphCache(backends.memory)
        self.graph_batch_sizes: tuple[int, ...] = ()
        self.capture = False
        #: keep every step's hidden rows (a proposer reads them through its context)
        self.tap_hidden = False
        self.last_hidden: torch.Tensor | None = None
        self.last_rows: list[int] = []
        #: the model's bounded replay when it is on (see :mod:`.layer_range`)
        self.bounded_replay: BoundedReplay | None = None
        #: image input: most ViT patches a tower pass encodes (see :mod:`.images`)
        self.max_encoder_patches: int | None = None
        #: static target steps build their plan on the device, inside the step (``CausalLM.plan_on_device``;
        #: the engine sets it where the model can): the host builds and copies no plan
        self.device_plan = False
        if backends.memory.supports_graphs:
            self.static_decode(max_graph_batch_size, capture=True)

    def static_decode(self, max_batch_size: int, capture: bool) -> None:
        """Run static steps of up to ``max_batch_size`` sequences (0: never), captured as graphs if
        ``capture``. Static without capture is what tests use to check the padded path on the CPU; it only
        costs there (padded rows and candidate columns are real work)."""
        ok = max_batch_size > 0 and self.model.supports_graphs
        self.graph_batch_sizes = (
            tuple(b for b in GRAPH_BATCH_SIZES if b < max_batch_size) + (max_batch_size,) if ok else ()
        )
        self.capture = ok and capture

    # ------------------------------------------------------------------ building the batch

    def prepare(self, sched: SchedulerOutput) -> ForwardBatch:
        """The step's batch on the device: built on the host from token counts, known token ids and the
        persistent batch's rows, copied once, then the pending ids filled in from the device."""
        scheduled = sched.scheduled
        seqs = [s.seq for s in scheduled]
        rows = self.batch.rows(seqs)
        images = step_images(self.model, scheduled, self.max_encoder_patches)
        q = _uniform_rows(scheduled) if images is None else 0
        key = self.graph_key(len(scheduled), max(s.start for s in scheduled), q) if q else None
        if key is not None:
            ids = [
                s.seq.token_ids[s.start : s.start + 1] + s.seq.spec_token_ids[: s.num_drafts]
                for s in scheduled
            ]
            pending = [b for b, x in enumerate(ids) if not x]  # the last token is pending: q = 1
            for b in pending:
                ids[b] = [0]
            batch = self._static_batch(seqs, [s.start for s in scheduled], ids, key, rows)
            if not self.device_plan:
                batch.plan = self.model.plan(batch, key[1])  # host-side tables and checks
            self.last_rows = [b * q for b in range(len(scheduled))]
            return self._fill_pending(
                batch.to(self.device), [b * q for b in pending], [rows[b] for b in pending]
            )
        ids, positions, qsl, ctx, logit_rows, pending = _mixed_vectors(scheduled)
        batch = ForwardBatch(
            input_ids=_ints(ids),
            positions=_ints(positions),
            query_start_loc=_ints(qsl),
            context_lens=_ints(ctx),
            block_tables=self.batch.block_tables(rows, len(rows)),
            block_size=self.block_size,
            logits_indices=_ints(logit_rows),
        )
        if images is not None:
            batch.image_rows, batch.image_embeds = images
        batch.tail = tail_batch(batch, self.bounded_replay, [s.seq.resumed_at for s in scheduled])
        batch.plan = self.model.plan(batch, None)
        self.last_rows = qsl[:-1]
        return self._fill_pending(
            batch.to(self.device), [qsl[b + 1] - 1 for b in pending], [rows[b] for b in pending]
        )

    def _fill_pending(self, batch: ForwardBatch, flat_rows: list[int], rows: list[int]) -> ForwardBatch:
        """Write the pending token ids (``tokens[rows]`` of the persistent batch) into the device batch at
        ``flat_rows``: device work queued after the step that sampled them, no host sync."""
        if flat_rows:
            dst, src = move_together([_ints(flat_rows), _ints(rows)], self.device)
            batch.input_ids[dst] = self.batch.tokens[src]
            if batch.tail is not None:
                batch.tail.batch.input_ids = batch.input_ids[batch.tail.rows]
        return batch

    def store_tokens(self, seqs: Sequence, tokens: torch.Tensor) -> None:
        """Keep ``tokens`` (device, one per sequence of ``seqs``, which all have rows) as each sequence's last
        sampled token, where the next step's pending ids are read from."""
        (rows,) = move_together([_ints(self.batch.row_of[s.seq_id] for s in seqs)], tokens.device)
        self.batch.tokens[rows] = tokens

    def graph_key(self, num_seqs: int, max_position: int, q: int = 1) -> tuple[int, int, int] | None:
        """``(batch bucket, context bucket, q)`` of a static step of ``num_seqs`` sequences of ``q`` rows
        each whose last position is at most ``max_position + q - 1``, or ``None`` when the step runs with
        dynamic shapes."""
        sizes = self.graph_batch_sizes
        if not sizes or num_seqs > sizes[-1] or q > MAX_STATIC_ROWS_PER_SEQ:
            return None
        context = min(
            max(MIN_CONTEXT_BUCKET, 1 << (max_position + q - 1).bit_length()),
            max(self.max_model_len, MIN_CONTEXT_BUCKET),
        )
        return next(b for b in sizes if b >= num_seqs), context, q

    def static_batch(
        self, seqs: Sequence, starts: Sequence[int], ids: Sequence[Sequence[int]]
    ) -> ForwardBatch | None:
        """A static batch (on the host, without a plan) where sequence ``b`` computes ``len(ids[b])`` rows
        from position ``starts[b]``, each padded to the longest; None when no bucket fits."""
        q = max((len(x) for x in ids), default=0)
        if not q or not all(ids):
            return None
        key = self.graph_key(len(seqs), max(s + len(x) - q for s, x in zip(starts, ids)), q)
        return self._static_batch(seqs, starts, ids, key) if key is not None else None

    def _static_batch(
        self,
        seqs: Sequence,
        starts: Sequence[int],
        ids: Sequence[Sequence[int]],
        key: tuple[int, int, int],
        rows: list[int] | None = None,
    ) -> ForwardBatch:
        """Sequence ``b`` owns rows ``b*q .. b*q+q-1``: its ids at consecutive positions from ``starts[b]``,
        then padding rows (id 0, position -1: every slot is the scratch slot); padding sequences are all
        padding. Every row's logits are computed; ``real_rows`` picks the real ones."""
        bucket, _, q = key
        flat_ids, pos, ctx, real = [], [], [], []
        for b in range(bucket):
            toks = list(ids[b]) if b < len(seqs) else []
            start = starts[b] if b < len(seqs) else 0
            flat_ids += toks + [0] * (q - len(toks))
            pos += list(range(start, start + len(toks))) + [-1] * (q - len(toks))
            ctx.append(start + len(toks) if toks else 0)
            real += range(b * q, b * q + len(toks))
        batch = ForwardBatch(
            input_ids=_ints(flat_ids),
            positions=_ints(pos),
            query_start_loc=_ints(range(0, (bucket + 1) * q, q)),
            context_lens=_ints(ctx),
            block_tables=(
                self.batch.block_tables(rows, bucket, self._table_width(key[1]))
                if rows is not None
                else {g: self.block_table(seqs, g, bucket) for g in self.groups}
            ),
            block_size=self.block_size,
            logits_indices=_ints(range(bucket * q)),
        )
        batch.graph_key, batch.num_real_rows = key, len(real)
        batch.real_rows = None if real == list(range(len(real))) else _ints(real)
        return batch

    def _table_width(self, context_bucket: int) -> int | None:
        """Block-table columns of a static step: the bucket's (a graph input of fixed shape) with a device-built
        plan, else the longest table's."""
        return -(-context_bucket // self.block_size) if self.device_plan else None

    def block_table(self, seqs: Sequence, group: str, rows: int) -> torch.Tensor:
        tables = [s.block_tables.get(group, ()) for s in seqs] + [()] * (rows - len(seqs))
        width = max(max(map(len, tables), default=0), 1)
        flat: list[int] = []
        for t in tables:
            flat.extend(t)
            flat.extend([-1] * (width - len(t)))
        return torch.tensor(flat, dtype=torch.int64).view(len(tables), width)

    # ------------------------------------------------------------------ running it

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Forward pass; returns float32 logits ``[len(batch.logits_indices), vocab]`` (real rows only)."""
        if batch.graph_key is not None:
            self.model.prepare_static(batch, self.kv)
        hidden, logits = self.run_static((), self._forward, batch)
        if self.tap_hidden:
            self.last_hidden = hidden
        if batch.graph_key is None:
            return logits
        if batch.real_rows is None:
            return logits[: batch.num_real_rows].clone()
        return logits.index_select(0, batch.real_rows)

    def run_static(
        self,
        key: tuple,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        batch: ForwardBatch,
        *inputs: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """``fn(batch, *inputs)``; for a static batch on a capturing platform, captured once per
        ``(*key, *batch.graph_key)`` (the target's steps use the empty key) and replayed afterwards."""
        if batch.graph_key is None or not self.capture:
            return fn(batch, *inputs)
        if batch.plan is None:  # built inside the step (device_plan) from the positions and block tables
            graph_inputs = [batch.input_ids, batch.positions, *(batch.block_tables[g] for g in self.groups)]
        else:
            graph_inputs = [batch.input_ids, *batch.plan.tensors()]
        graph_inputs += inputs
        return self.graphs.run((*key, *batch.graph_key), lambda: fn(batch, *inputs), graph_inputs, batch)

    def _forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        if batch.plan is None and batch.graph_key is not None:  # device_plan: built here, inside the step
            batch = dataclasses.replace(batch, plan=self.model.plan_on_device(batch, batch.graph_key[1]))
        hidden = self.model.forward(batch, self.kv)
        if batch.logits_indices.numel() == 0:
            return hidden, torch.empty(0, self.model.vocab_size, dtype=torch.float32, device=self.device)
        return hidden, self.model.compute_logits(hidden[batch.logits_indices]).float()

    def execute(self, sched: SchedulerOutput) -> torch.Tensor:
        return self.run(self.prepare(sched))


def _uniform_rows(scheduled: list[ScheduledSeq]) -> int:
    """``q`` when every sequence computes ``q`` rows from its last token on and samples from each (a decode
    or verify step), else 0."""
    if not scheduled:
        return 0
    q = 0
    for s in scheduled:
        if (
            not s.samples
            or s.start + 1 != s.seq.num_scheduled_tokens
            or s.prompt_logprob_end > s.prompt_logprob_start
        ):
            return 0
        q = max(q, 1 + s.num_drafts)
    return q


def _mixed_vectors(scheduled: list[ScheduledSeq]) -> tuple[list[int], ...]:
    """Flat ids, positions, query starts, context lengths, logit rows, and the sequences whose last row's id
    is pending (a placeholder 0 here)."""
    ids: list[int] = []
    pending: list[int] = []
    positions: list[int] = []
    qsl = [0]
    ctx: list[int] = []
    rows: list[int] = []
    for b, s in enumerate(scheduled):
        base, start, end = qsl[-1], s.start, s.start + s.num_tokens
        ids.extend(s.seq.token_ids[start:end])
        if end > len(s.seq.token_ids) and not s.num_drafts:  # at most the last one (overlap scheduling)
            ids.append(0)
            pending.append(b)
        if s.num_drafts:
            ids.extend(s.seq.spec_token_ids[: s.num_drafts])
        positions.extend(range(start, end))
        qsl.append(base + s.num_tokens)
        ctx.append(end)
        rows.extend(range(base + s.prompt_logprob_start - start, base + s.prompt_logprob_end - start))
        if s.samples:
            rows.extend(range(base + s.num_tokens - 1 - s.num_drafts, base + s.num_tokens))
    return ids, positions, qsl, ctx, rows, pending


def _ints(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)
