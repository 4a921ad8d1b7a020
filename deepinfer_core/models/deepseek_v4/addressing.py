"""Slot addressing for one step: which pool rows each token writes and reads.

Every piece of V4 state is addressed by absolute position (see :mod:`deepinfer_core.kv.spec`): token ``p``
of request ``b`` lives in the ``window`` group at block ``block_tables["window"][b, p // block_size]``,
offset ``p % block_size``; compressed entry ``e`` of ratio ``r`` (covering tokens ``e*r .. e*r+r-1``) lives in
the ``compressed`` group at block ``block_tables["compressed"][b, e*r // block_size]``, offset
``e % (block_size // r)``. A slot is ``block * entries_per_block + offset`` in the flattened pool.

Causality: query ``p`` sees window tokens ``max(0, p-W+1) .. p`` and compressed entries ``e < (p+1) // r``;
the window of entry ``e`` closes at token ``p = e*r + r - 1``, i.e. when ``(p + 1) % r == 0``.

The tables are built on the host: the model runner's ``prepare`` calls :meth:`DeepseekV4ForCausalLM.plan` on the
host batch and moves the tables to the device with :meth:`StepAddressing.to`, so the forward pass itself never
synchronises with the host. They are computed with numpy (a step's tables are a few hundred tiny array ops:
numpy's per-op cost is a third of torch's on the host, and the plan is most of a decode step's host work) and
kept as torch tensors sharing that memory. In *static* mode (CUDA-graph replay) every shape
depends only on the row count and a context bucket: each row has one (possibly unused) compression entry
per kind and ``context_bucket // r`` candidate columns; unused entries write to slot ``-1``, the last slot
of each pool, which the model runner keeps as a scratch block that no request owns. The candidate tables
(``rows x context_bucket / ratio``, megabytes at long contexts) are built on the host only when small
(:data:`HOST_CANDIDATES` entries: a few launches saved in a decode step); larger ones are not: the host checks
that every block they need is present, and :meth:`StepAddressing.to` builds them on the device from the block
table (tensor ops only, no synchronisation). Dynamic steps (prefill chunks) defer them
the same way, ``max((p + 1) // r)`` wide: an 8k-token chunk's ratio-1 table is 8192 x 8192 slots (512 MB of
int64), which the host would build in seconds and copy, where the device builds it in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from deepinfer_core.models.batch import ForwardBatch, PackedPlan, move_together
from deepinfer_core.ops.compose import StaticPlanTables, compose_static_plan
from deepinfer_core.ops.slot_tables import candidate_slots, device_slots


@dataclass
class Compression:
    """The compression windows of one ``(ratio, overlap)`` kind that close in this step, and what queries see."""

    entry_slots: torch.Tensor  # [E] slot of each closing entry in the compressed pools
    entry_positions: torch.Tensor  # [E] RoPE position of an entry: its window's first token, e * r
    src_slots: (
        torch.Tensor
    )  # [E, L] window-pool slots of the source tokens (L = 2r with overlap, else r); -1 empty
    cand_slots: (
        torch.Tensor | None
    )  # [T, C] compressed-pool slots query t may attend (e < (p+1)//r); -1 padding
    #: ``C``; on the host ``cand_slots`` is ``None`` until :meth:`StepAddressing.to` (or first use) builds it
    cand_width: int = 0


def _host(t) -> np.ndarray:
    """A host array of ``t`` (a torch tensor anywhere, or already an array)."""
    if isinstance(t, np.ndarray):
        return t
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


class StepAddressing(PackedPlan):
    """Slot tables of one :class:`ForwardBatch`, computed once and shared by every layer.

    ``kinds``: the ``(ratio, overlap)`` compressions to build now (the rest are built on first use);
    ``context_bucket``: static mode, candidate tables ``context_bucket // ratio`` wide and one entry row
    per token (see the module docstring). :meth:`with_window_group` gives the same tables with the window
    slots of another window group (V4.1's decoder layers keep their window KV in a group of their own)."""

    def __init__(
        self,
        batch: ForwardBatch,
        sliding_window: int,
        kinds: tuple[tuple[int, bool], ...] = (),
        context_bucket: int | None = None,
    ):
        self.batch = batch
        self.block_size = batch.block_size
        self.context_bucket = context_bucket
        self.req = batch.request_index()
        self.positions = batch.positions.long()
        self._req, self._pos = _host(self.req), _host(self.positions)
        self.sliding_window = sliding_window
        self.token_slots, self.window_slots = self._window("window")
        self._compressions: dict[tuple[int, bool], Compression] = {k: self._build(*k) for k in kinds}

    @classmethod
    def static_on_device(
        cls,
        batch: ForwardBatch,
        sliding_window: int,
        kinds: tuple[tuple[int, bool], ...],
        context_bucket: int,
        static_plan: Callable[..., StaticPlanTables] | None = None,
    ) -> StepAddressing:
        """The static tables of ``batch`` built where it lives, with tensor ops only (no host synchronisation,
        no checks), so a captured step can hold them: the step's graph then reads only ``input_ids``,
        ``positions`` and the block tables, and the host builds no plan. ``batch`` is static (every sequence
        ``q = T / B`` rows, padding rows at position ``-1``) with block tables at least
        ``context_bucket / block_size`` wide. Every table equals the host's (:meth:`__init__` with
        ``context_bucket``) where the host's checks pass; where a block the host would refuse is absent, a
        written slot is ``-1`` (the scratch slot) and a read one negative (nothing read), never another row's.
        ``static_plan``: the backends' resolved step (``backends.fused.static_plan``: one kernel a table on a
        GPU); default the core's composition of torch ops."""
        out = object.__new__(cls)
        out.block_size, out.batch, out.context_bucket, out.sliding_window = (
            batch.block_size,
            None,
            context_bucket,
            sliding_window,
        )
        out.positions = pos = batch.positions.long()
        t, b = pos.shape[0], batch.context_lens.shape[0]
        window = batch.block_tables["window"]
        build = static_plan or partial(compose_static_plan, None)
        out.req, out.token_slots, out.window_slots, tables = build(
            pos, window, batch.block_tables["compressed"], max(1, t // max(b, 1)), sliding_window, kinds,
            context_bucket, out.block_size,
        )  # fmt: skip
        out._window_table = window
        out._compressions = {
            kind: Compression(*parts, context_bucket // kind[0])
            for kind, parts in zip(kinds, tables, strict=True)
        }
        return out

    def device_window_group(self, block_tables: dict[str, torch.Tensor], group: str) -> StepAddressing:
        """(An addressing from :meth:`static_on_device`.) The same tables with ``token_slots`` and ``window_slots``
        in window group ``group`` (``block_tables[group]``), tensor ops only: what :meth:`with_window_group`
        gives on the host for a static step."""
        out = object.__new__(StepAddressing)
        out.__dict__.update(self.__dict__)
        w = torch.arange(1 - self.sliding_window, 1, device=self.positions.device)
        pos = self.positions[:, None] + w[None, :]
        out.window_slots = device_slots(block_tables[group], self.req[:, None], pos, self.block_size, 1)
        out.token_slots = out.window_slots[:, -1].contiguous()
        return out

    def device_window_slots(self, pos: torch.Tensor) -> torch.Tensor:
        """(An addressing from :meth:`static_on_device`.) ``window`` group slots of positions ``pos [T, k]`` of
        each row's sequence, tensor ops only (``-1`` before the start or in an absent block)."""
        return device_slots(self._window_table, self.req[:, None], pos, self.block_size, 1)

    def _window_positions(self) -> np.ndarray:
        """``[T, W]``: the position each column of :attr:`window_slots` holds (negative: before the start)."""
        w = self.sliding_window
        return self._pos[:, None] + (np.arange(w, dtype=np.int64) - (w - 1))[None, :]

    def _window(
        self, group: str, state_from: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        win_pos = self._window_positions()
        if state_from is not None:  # never written: read nothing (and need no block)
            win_pos = np.where(win_pos < _host(state_from)[self._req][:, None], -1, win_pos)
        token = self.slots(group, self._req, self._pos, 1)
        return token, self.slots(group, np.broadcast_to(self._req[:, None], win_pos.shape), win_pos, 1)

    def with_window_group(self, group: str, state_from: torch.Tensor | None = None) -> StepAddressing:
        """(On the host.) These tables, sharing the compressions, with ``token_slots`` and ``window_slots`` in
        window group ``group``; window columns below ``state_from[request]`` (state never written) read
        nothing (``-1``)."""
        out = object.__new__(StepAddressing)
        out.__dict__.update(self.__dict__)
        out.token_slots, out.window_slots = out._window(group, state_from)
        return out

    def window_to(self, device: torch.device, moved: StepAddressing) -> StepAddressing:
        """This view (from :meth:`with_window_group` of the addressing ``moved`` is a device copy of) on
        ``device``: ``moved``'s tables with this view's window slots."""
        out = object.__new__(StepAddressing)
        out.__dict__.update(moved.__dict__)
        out.token_slots, out.window_slots = move_together([self.token_slots, self.window_slots], device)
        return out

    def to(self, device: torch.device) -> StepAddressing:
        """A copy with every table on ``device`` (all compressions must be built already), in one copy; deferred
        candidate tables are built there."""
        return self.from_moved(iter(move_together(self.host_tensors(), device)))

    def host_tensors(self) -> list[torch.Tensor]:
        """The tables :meth:`to` copies, in order; :meth:`from_moved` takes them back from the device (the step's
        batch packs them into its own copy: :meth:`ForwardBatch.to`)."""
        host = [self.req, self.positions, self.token_slots, self.window_slots]
        for c in self._compressions.values():
            host += [c.entry_slots, c.entry_positions, c.src_slots]
            host += [c.cand_slots] if c.cand_slots is not None else []
        if any(c.cand_slots is None for c in self._compressions.values()):
            host.append(self.batch.block_tables["compressed"])
        return host

    def from_moved(self, moved: Iterator[torch.Tensor]) -> StepAddressing:
        """This addressing on the device, from :meth:`host_tensors` moved there (in order, consumed from
        ``moved``); deferred candidate tables are built there."""
        out = object.__new__(StepAddressing)
        out.batch, out.block_size, out.context_bucket = None, self.block_size, self.context_bucket
        out.sliding_window = self.sliding_window
        kinds = list(self._compressions.items())
        deferred = any(c.cand_slots is None for _, c in kinds)
        out.req, out.positions, out.token_slots, out.window_slots = (next(moved) for _ in range(4))
        parts = [(k, c, [next(moved) for _ in range(3 if c.cand_slots is None else 4)]) for k, c in kinds]
        table = next(moved) if deferred else None
        out._compressions = {}
        for (ratio, overlap), c, t in parts:
            if c.cand_slots is None:  # deferred: build it where it is used
                t.append(candidate_slots(table, out.req, out.positions, ratio, c.cand_width, self.block_size))
            out._compressions[(ratio, overlap)] = Compression(*t, cand_width=c.cand_width)
        return out

    def tensors(self) -> list[torch.Tensor]:
        """Every table, in a fixed order (graph replay copies them into the captured buffers)."""
        out = [self.positions, self.token_slots, self.window_slots]
        for key in sorted(self._compressions):
            c = self._compressions[key]
            out += [c.entry_slots, c.entry_positions, c.src_slots, c.cand_slots]
        return out

    def slots(self, group: str, req, pos, tokens_per_entry: int) -> torch.Tensor:
        """Slot of the entry holding position ``pos`` (``-1`` where ``pos < 0``), ``req`` the request of each
        (torch tensors or host arrays); raises if a needed block is absent."""
        return self._tensor(self._slots(group, _host(req), _host(pos), tokens_per_entry))

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        """A table as a tensor where the batch lives (sharing the array's memory on the host)."""
        t = _tensor(a)
        return t if self.positions.device.type == "cpu" else t.to(self.positions.device)

    def _slots(self, group: str, req: np.ndarray, pos: np.ndarray, tokens_per_entry: int) -> np.ndarray:
        table = _host(self.batch.block_tables[group])
        bs, epb = self.block_size, self.block_size // tokens_per_entry
        valid = pos >= 0
        p = np.where(valid, pos, 0)
        col = p // bs
        if (col >= table.shape[1]).any():
            raise RuntimeError(
                f"block_tables[{group!r}] has {table.shape[1]} columns; position {int(pos.max())} needs more"
            )
        block = table[req, col]
        missing = valid & (block < 0)
        if missing.any():
            i = int(np.flatnonzero(missing)[0])
            raise RuntimeError(
                f"no {group!r} block for position {int(pos.flat[i])} of request {int(req.flat[i])}: "
                "state still needed by this step was released"
            )
        return np.where(valid, block * epb + (p // tokens_per_entry) % epb, -1)

    def compression(self, ratio: int, overlap: bool) -> Compression:
        """The compression of ``(ratio, overlap)``, its candidate table built where this addressing lives if
        it was deferred (a host addressing used without :meth:`to`)."""
        key = (ratio, overlap)
        if key not in self._compressions:
            if self.batch is None:
                raise RuntimeError(f"compression {key} was not planned on the host (StepAddressing kinds)")
            self._compressions[key] = self._build(ratio, overlap)
        c = self._compressions[key]
        if c.cand_slots is None:
            table = self.batch.block_tables["compressed"].to(self.positions.device)
            cand = candidate_slots(table, self.req, self.positions, ratio, c.cand_width, self.block_size)
            c = self._compressions[key] = Compression(
                c.entry_slots, c.entry_positions, c.src_slots, cand, c.cand_width
            )
        return c

    def _build(self, ratio: int, overlap: bool) -> Compression:
        pos, req = self._pos, self._req
        closes = (pos + 1) % ratio == 0
        if self.context_bucket is None:
            rows = np.flatnonzero(closes)
        else:  # one entry row per token; rows that close nothing address slot -1 (scratch)
            rows = np.arange(pos.shape[0])
        c_req = req[rows]
        entry = (pos[rows] + 1) // ratio - 1
        live = closes[rows] & (entry >= 0)
        first = np.where(live, entry * ratio, -1)
        entry_slots = self._slots("compressed", c_req, first, ratio)
        span = 2 * ratio if overlap else ratio
        start = first - (ratio if overlap else 0)
        src_pos = np.where(live[:, None], start[:, None] + np.arange(span, dtype=np.int64)[None, :], -1)
        src_slots = self._slots("window", np.broadcast_to(c_req[:, None], src_pos.shape), src_pos, 1)
        n_visible = (pos + 1) // ratio
        self._check_candidate_blocks(n_visible * ratio)
        if self.context_bucket is not None:
            width = self.context_bucket // ratio
        else:
            width = int(n_visible.max()) if pos.size else 0
        entry_pos = np.maximum(first, 0)
        tables = (self._tensor(entry_slots), self._tensor(entry_pos), self._tensor(src_slots))
        cand = None  # large: built by to() where the step runs
        if pos.shape[0] * width <= HOST_CANDIDATES:
            table = _host(self.batch.block_tables["compressed"])
            cand = self._tensor(_candidate_slots_host(table, req, pos, ratio, width, self.block_size))
        return Compression(*tables, cand, width)

    def _check_candidate_blocks(self, covered: torch.Tensor) -> None:
        """Every ``compressed`` block holding a position below ``covered[t]`` (row ``t``'s visible entries)
        is present: the check :meth:`slots` makes on a full candidate table, made per block."""
        table = _host(self.batch.block_tables["compressed"])
        need = (covered + self.block_size - 1) // self.block_size  # block columns row t reads
        if (need > table.shape[1]).any():
            raise RuntimeError(
                f"block_tables['compressed'] has {table.shape[1]} columns; a row needs {int(need.max())}"
            )
        cols = np.arange(table.shape[1], dtype=np.int64)[None, :]
        missing = (cols < need[:, None]) & (table[self._req] < 0)
        if missing.any():
            t, col = (int(i) for i in np.argwhere(missing)[0])
            raise RuntimeError(
                f"no 'compressed' block for position {col * self.block_size} of request {int(self._req[t])}: "
                "state still needed by this step was released"
            )


#: candidate tables of at most this many entries (a decode step's: batch 16 at a 4k context bucket, ratio 4) are
#: built on the host with the step's other tables and copied with them; larger ones on the device
#: (:func:`candidate_slots`, ~10 launches a kind, each ~10 us of host time on the H200's host, v26)
HOST_CANDIDATES = 1 << 14


def _candidate_slots_host(
    table: np.ndarray, req: np.ndarray, pos: np.ndarray, ratio: int, width: int, block_size: int
) -> np.ndarray:
    """:func:`candidate_slots` on the host, the same formula in numpy."""
    epb = block_size // ratio
    cols = np.arange(width, dtype=np.int64)[None, :]
    column = np.minimum(cols // epb, max(table.shape[1] - 1, 0))
    slots = table[req[:, None], column] * epb + cols % epb
    return np.where(cols >= ((pos + 1) // ratio)[:, None], -1, slots)
