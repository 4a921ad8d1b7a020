"""Caches of expert weight tables (device arrays of base addresses) and trivial tile schedules."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch


class TableCache:
    """``build()`` result per tuple of weight objects, kept while those objects live.

    Keyed by the objects' ids, each checked through a weak reference (or, for tensors, which do
    support weak references too, the same) so a recycled id never returns a stale table. Tables
    hold the tensors' addresses, so callers must not swap a weight's storage in place."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, ...], tuple[list[weakref.ref], Any]] = {}

    def get(self, objs: tuple[object, ...], build: Callable[[], Any]) -> Any:
        key = tuple(id(o) for o in objs)
        hit = self._entries.get(key)
        if hit is not None and all(r() is o for r, o in zip(hit[0], objs)):
            return hit[1]
        value = build()
        refs = [weakref.ref(o, lambda _r, k=key: self._entries.pop(k, None)) for o in objs]
        self._entries[key] = (refs, value)
        return value


class ScheduleCache:
    """Tile schedules of one-expert problems (dense GEMMs), read-only, kept per ``(rows, block_m, device)``.

    A decode step has ~60 dense GEMMs, and building each one's schedule was four small kernels (H200
    profile, NOTES.md v6). Only schedules of at most ``max_rows`` rows (decode and graph buckets) are
    kept, and none made while a CUDA graph is being captured: those hold no values until replay."""

    def __init__(self, max_rows: int = 1024) -> None:
        self.max_rows = max_rows
        self._entries: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def get(self, rows: int, block_m: int, device: torch.device):
        key = (rows, block_m, device)
        hit = self._entries.get(key)
        if hit is not None:
            return hit
        n = -(-rows // block_m)
        start = torch.arange(n, device=device, dtype=torch.int64) * block_m
        sched = (torch.zeros(n, dtype=torch.int64, device=device), start, torch.full_like(start, rows))
        return self._keep(key, rows, sched, device)

    def grouped(self, rows: int, groups: int, block_m: int, device: torch.device):
        """``(row_index, tile_expert, tile_start, tile_end)`` of a grouped linear: sorted row ``g * rows + t``
        is row ``t * groups + g`` of the ``[rows * groups, K]`` input (and output); group ``g``'s tiles
        cover sorted rows ``[g * rows, (g + 1) * rows)``. Built on the device (a host-to-device copy of
        pageable memory would wait for the stream, and prefill sizes are not cached)."""
        key = ("grouped", rows, groups, block_m, device)
        hit = self._entries.get(key)
        if hit is not None:
            return hit
        i64 = dict(dtype=torch.int64, device=device)
        g = torch.arange(groups, **i64)
        idx = (torch.arange(rows, **i64)[None, :] * groups + g[:, None]).reshape(-1)
        per = -(-rows // block_m)
        expert = g.repeat_interleave(per)
        start = expert * rows + torch.arange(per, **i64).repeat(groups) * block_m
        out = (idx, expert, start, (expert + 1) * rows)
        return self._keep(key, rows, out, device)

    def _keep(self, key, rows: int, value, device: torch.device):
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if rows <= self.max_rows and not capturing:
            self._entries[key] = value
        return value
