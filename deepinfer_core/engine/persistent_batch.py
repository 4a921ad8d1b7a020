"""The persistent batch: one row per running sequence, kept from step to step.

A sequence gets a row when a step first schedules it. Rows are reclaimed lazily: when none is free, the
rows of sequences no longer running (finished, aborted, preempted) are given back, and only then does the
capacity double. Reclaiming is safe under overlap scheduling: a sequence not running reads nothing from
its row, and a new owner writes ``tokens[row]`` (by sampling) before it reads it. What a row holds is written when it changes, not rebuilt every step:

- ``tables[group][row]``: the sequence's block table (host, int64, ``-1`` where there is no block). It is
  rewritten only when the KV manager changed the sequence's tables (``Sequence.tables_version`` moved),
  which a decode step inside a block never does; a step's block tables are one gather of its rows.
- ``tokens[row]``: on the device, the last token sampled for the row (written by the step that sampled it,
  on the device; read by the next step's inputs without the host seeing it: overlap scheduling).
- the sampling parameters (temperature, top-k, top-p, min-p) of the row's request, written once; with the
  owner's sampling seed, they are all a step's draws need (keyed randomness: no generator per row).

Row ``capacity`` (one past the last) is all padding (``-1`` tables), used for the padded sequences of a
static step. Rows are reused lowest first.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from deepinfer_core.engine.sequence import SeqStatus
from deepinfer_core.models.batch import move_together
from deepinfer_core.ops.sampling import SamplingTensors, cuts_used


class PersistentBatch:
    def __init__(self, groups: Sequence[str], max_blocks: int, device: torch.device, capacity: int = 64):
        self.groups = list(groups)
        self.device = device
        self.max_blocks = max(1, max_blocks)
        self.row_of: dict[int, int] = {}  # seq_id -> row
        self.owner: list = []  # row -> its sequence (None: free)
        self.capacity = 0
        self._free: list[int] = []
        self.tables: dict[str, torch.Tensor] = {}
        self.table_len: dict[str, list[int]] = {g: [] for g in self.groups}
        self.version: list[int] = []
        self.tokens = torch.zeros(0, dtype=torch.int64, device=device)
        self.params = torch.zeros(4, 0, dtype=torch.float32)  # temperature, top_k, top_p, min_p per row
        # per row: whether it uses top-k, top-p, min-p (SamplingTensors.any_*)
        self.cuts: list[tuple[bool, bool, bool]] = []
        self._grow(max(1, capacity))

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        for g in self.groups:
            t = torch.full((capacity + 1, self.max_blocks), -1, dtype=torch.int64)
            if old:
                t[:old] = self.tables[g][:old]
            self.tables[g] = t
            self.table_len[g] += [0] * (capacity - old)
        self.version += [-1] * (capacity - old)
        self.owner += [None] * (capacity - old)
        self.cuts += [(False, False, False)] * (capacity - old)
        tokens = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        tokens[:old] = self.tokens
        self.tokens = tokens
        params = torch.zeros(4, capacity + 1, dtype=torch.float32)
        params[:, :old] = self.params[:, :old]
        self.params = params
        for r in range(old, capacity):
            heapq.heappush(self._free, r)
        self.capacity = capacity

    def _widen(self, width: int) -> None:
        new = max(width, 2 * self.max_blocks)
        for g in self.groups:
            t = torch.full((self.capacity + 1, new), -1, dtype=torch.int64)
            t[:, : self.max_blocks] = self.tables[g]
            self.tables[g] = t
        self.max_blocks = new

    # ------------------------------------------------------------------ rows

    def rows(self, seqs: Sequence) -> list[int]:
        """The row of each of ``seqs`` (assigned on first sight), with every changed block table written."""
        out = []
        row_of, version = self.row_of, self.version
        for seq in seqs:
            r = row_of.get(seq.seq_id)
            if r is None:
                r = self._assign(seq)
            if version[r] != seq.tables_version:
                self._write_tables(r, seq)
            out.append(r)
        return out

    def _assign(self, seq) -> int:
        if not self._free:
            self._reclaim()
        if not self._free:
            self._grow(2 * self.capacity)
        r = heapq.heappop(self._free)
        self.row_of[seq.seq_id] = r
        self.owner[r] = seq
        self.version[r] = -1
        p = seq.params
        self.params[:, r] = torch.tensor([p.temperature, p.top_k, p.top_p, p.min_p], dtype=torch.float32)
        self.cuts[r] = cuts_used(p.top_k, p.top_p, p.min_p)
        return r

    def _reclaim(self) -> None:
        """Free the rows of sequences that are not running (their status is not ``RUNNING``)."""
        for seq in list(self.owner):
            if seq is not None and seq.status is not SeqStatus.RUNNING:
                self.release(seq)

    def release(self, seq) -> None:
        """Give the row of ``seq`` back; no-op without one."""
        r = self.row_of.pop(seq.seq_id, None)
        if r is not None:
            self.owner[r] = None
            heapq.heappush(self._free, r)

    def _write_tables(self, r: int, seq) -> None:
        tables = seq.block_tables
        for g in self.groups:
            t = tables.get(g, ())
            n, old = len(t), self.table_len[g][r]
            if n > self.max_blocks:
                self._widen(n)
            row = self.tables[g][r]
            if n:
                row[:n] = torch.tensor(t, dtype=torch.int64)
            if old > n:
                row[n:old] = -1
            self.table_len[g][r] = n
        self.version[r] = seq.tables_version

    # ------------------------------------------------------------------ a step's view

    def block_tables(
        self, rows: list[int], num_rows: int, width: int | None = None
    ) -> dict[str, torch.Tensor]:
        """``group -> [num_rows, width]`` tables of ``rows`` (padded with all ``-1`` rows), width the longest
        table among them (at least 1) unless given (a static step's fixed shape: columns past the longest are
        ``-1``, those past ``width`` left out)."""
        idx = torch.tensor(rows + [self.capacity] * (num_rows - len(rows)), dtype=torch.int64)
        if width is not None and width > self.max_blocks:
            self._widen(width)
        out = {}
        for g in self.groups:
            lens = self.table_len[g]
            cols = max(max((lens[r] for r in rows), default=0), 1) if width is None else width
            out[g] = self.tables[g][idx, :cols]
        return out

    def sampling_tensors(
        self, rows: list[int], device: torch.device, positions: list[int]
    ) -> SamplingTensors:
        """The rows' parameters and keyed randomness: each owner's sampling seed, and ``positions`` (of the
        tokens the rows draw)."""
        keyed = torch.tensor([[self.owner[r].sampling_seed for r in rows], positions], dtype=torch.int64)
        p, k = move_together([self.params[:, rows], keyed], device)
        cuts = self.cuts
        uses = (any(cuts[r][i] for r in rows) for i in range(3))  # Python over the rows: no torch op
        return SamplingTensors(p[0], p[1].to(torch.int64), p[2], p[3], *uses, seeds=k[0], positions=k[1])
