"""What the model runner hands a model for one step: the flattened tokens of every scheduled request.

``T`` tokens from ``B`` requests, request ``b`` owning rows ``query_start_loc[b]:query_start_loc[b+1]``.
Request ``b`` already has ``context_lens[b] - query_lens[b]`` computed tokens in the KV pools; the
step computes (and writes state for) positions ``context_lens[b] - query_lens[b] ... context_lens[b] - 1``.

The layer-range seam: a model that declares :meth:`~deepinfer_core.models.base.CausalLM.bounded_replay` may
get a :class:`TailBatch` in :attr:`ForwardBatch.tail`, the rows its later layers need and their metadata.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute position of each token in its request
    query_start_loc: torch.Tensor  # [B+1] int64
    context_lens: torch.Tensor  # [B] int64, computed tokens after this step
    block_tables: dict[str, torch.Tensor]  # group name -> [B, max_blocks] int64 physical block ids (-1: none)
    block_size: int
    #: rows of the flattened tokens whose logits are needed (last token of each request that
    #: samples, every prompt row for prompt_logprobs, every draft row for verification)
    logits_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    #: optional: run only these decoder layers (``None``: all); for V4.1-style partial replays
    layer_range: tuple[int, int] | None = None
    #: model-specific tables built on the host by ``CausalLM.plan`` (``None``: the model builds them)
    plan: Any = None
    #: static steps (graph replay): ``(batch bucket, context bucket, rows per sequence)``, how many logits rows
    #: are real, and which (``None``: the first ``num_real_rows``)
    graph_key: tuple[int, ...] | None = None
    num_real_rows: int | None = None
    real_rows: torch.Tensor | None = None
    #: the layer-range seam: the rows layers ``>= tail.first_layer`` run on (``None``: every row)
    tail: TailBatch | None = None
    #: image input: rows ``[N]`` of the step inside an image span, and the embeddings ``[N, hidden]`` that
    #: replace their token embeddings (``None``: no image position in the step)
    image_rows: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None

    def to(self, device: torch.device) -> ForwardBatch:
        """A copy with every tensor on ``device`` (one copy for all of them), the plan's tables in the same copy
        when it lists them (``host_tensors`` / ``from_moved``), else moved by its own ``.to``."""
        groups = list(self.block_tables)
        extra = [self.real_rows] if self.real_rows is not None else []
        own = (
            [self.input_ids, self.positions, self.query_start_loc, self.context_lens, self.logits_indices]
            + [self.block_tables[g] for g in groups]
            + extra
        )
        # a plan that lists its tables (StepAddressing.host_tensors) rides in the same copy when they share its dtype
        ride = list(self.plan.host_tensors()) if isinstance(self.plan, PackedPlan) else []
        if ride and len({t.dtype for t in own + ride}) != 1:
            ride = []
        moved = move_together(own + ride, device)
        ids, pos, qsl, ctx, rows, *tables = moved[: len(own)]
        real = tables.pop() if extra else None
        out = ForwardBatch(
            input_ids=ids,
            positions=pos,
            query_start_loc=qsl,
            context_lens=ctx,
            block_tables=dict(zip(groups, tables, strict=True)),
            block_size=self.block_size,
            logits_indices=rows,
            layer_range=self.layer_range,
            plan=(
                self.plan.from_moved(iter(moved[len(own) :]))
                if ride
                else (self.plan.to(device) if self.plan is not None else None)
            ),
            graph_key=self.graph_key,
            num_real_rows=self.num_real_rows,
            real_rows=real,
        )
        out.tail = None if self.tail is None else self.tail.to(device, out)
        if self.image_rows is not None:
            out.image_rows = self.image_rows.to(device)
            out.image_embeds = self.image_embeds.to(device)
        return out

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_requests(self) -> int:
        return int(self.context_lens.shape[0])

    def request_index(self) -> torch.Tensor:
        """``[T]`` index of the request each token row belongs to."""
        counts = self.query_start_loc[1:] - self.query_start_loc[:-1]
        return torch.repeat_interleave(torch.arange(self.num_requests, device=counts.device), counts)


class PackedPlan:
    """A step's plan whose tables travel in the batch's own host-to-device copy (:meth:`ForwardBatch.to`)."""

    def host_tensors(self) -> list[torch.Tensor]:
        """The tables to copy, in order."""
        raise NotImplementedError

    def from_moved(self, moved: Iterator[torch.Tensor]) -> PackedPlan:
        """The plan on the device, from :meth:`host_tensors` moved there (consumed in order from ``moved``)."""
        raise NotImplementedError


@dataclass
class TailBatch:
    """The rows of a step that layers ``>= first_layer`` need: per request, the last ``window`` rows of its
    chunk (every row when it wants logits of an earlier one, e.g. prompt logprobs).

    ``rows [T']`` are ascending rows of the step, each request's contiguous. ``batch`` is the same step
    restricted to them: ``input_ids`` and ``positions`` of those rows, its own ``query_start_loc``, the
    step's ``context_lens`` and ``block_tables`` (every request still ends where its chunk ends), and
    ``logits_indices`` pointing at the same rows as the step's, counted in ``rows``. A model runs its early
    layers on every row, gathers ``rows`` and runs the later ones on ``batch``; ``batch.plan`` is its to fill
    (in :meth:`~deepinfer_core.models.base.CausalLM.plan`)."""

    first_layer: int
    rows: torch.Tensor  # [T'] int64
    batch: ForwardBatch
    #: [B] int64: per request, the first position whose late-layer state was written (rows of this chunk
    #: before its first kept row were not run; positions before a prefix-cache hit were never run)
    state_from: torch.Tensor | None = None

    def to(self, device: torch.device, step: ForwardBatch) -> TailBatch:
        """A copy on ``device`` that shares ``context_lens`` and ``block_tables`` with its (moved) step."""
        b = self.batch
        state_from = (
            self.state_from if self.state_from is not None else torch.zeros_like(b.query_start_loc[1:])
        )
        rows, ids, pos, qsl, logits, state_from = move_together(
            [self.rows, b.input_ids, b.positions, b.query_start_loc, b.logits_indices, state_from], device
        )
        plan = None if b.plan is None else b.plan.to(device)
        sub = ForwardBatch(
            ids, pos, qsl, step.context_lens, step.block_tables, b.block_size, logits, plan=plan
        )
        return TailBatch(self.first_layer, rows, sub, state_from)


def move_together(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """``tensors`` on ``device`` through a single host-to-device copy when they share a dtype (the
    per-step index vectors and tables are all int64); tensors already there are returned as they are.

    To a CUDA device the copy goes from pinned memory without blocking: a pageable copy would wait for
    every step queued on the stream, and the overlapped engine builds step N+1 while step N runs (the
    pinned staging buffer is not reused before the copy is done: torch's host allocator tracks it)."""
    device = torch.device(device)
    if all(t.device == device for t in tensors):
        return list(tensors)
    if len({t.dtype for t in tensors}) != 1:
        return [_to(t, device) for t in tensors]
    flat = _to(torch.cat([t.reshape(-1) for t in tensors]), device)
    return [
        part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)
    ]


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
