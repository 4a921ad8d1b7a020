"""Slot tables from block tables with tensor ops only (no host synchronisation, no checks): what a captured
step holds when it builds its own plan (``device_plan``), and a prefill chunk's deferred candidate tables.

A slot is ``block * entries_per_block + offset`` in a flattened pool (see
:mod:`deepinfer_core.models.deepseek_v4.addressing`, whose host plan computes the same tables in numpy with
its checks). Negative positions, columns past a table and absent blocks (``-1``) give negative slots: a written
slot is ``-1`` (the pool's scratch slot), a read one reads nothing."""

from __future__ import annotations

import torch


def with_absent_column(table: torch.Tensor) -> torch.Tensor:
    """``table`` with one more column, all ``-1`` (no block)."""
    return torch.nn.functional.pad(table, (0, 1), value=-1)


def lookup_slots(
    table: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, block_size: int, tokens_per_entry: int
) -> torch.Tensor:
    """On a table from :func:`with_absent_column`: the slot of the entry holding ``pos`` (``req`` and ``pos``
    broadcast together), ``-1`` where ``pos < 0``, past the table's columns or in an absent block (each reads
    the last column: negative columns clamp to -1)."""
    epb = block_size // tokens_per_entry
    block = table[req, (pos // block_size).clamp(-1, table.shape[1] - 1)]
    entry = pos // tokens_per_entry if tokens_per_entry > 1 else pos
    return torch.where(block >= 0, block * epb + entry % epb, -1)


def device_slots(
    table: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, block_size: int, tokens_per_entry: int
) -> torch.Tensor:
    """:func:`lookup_slots` on a plain block table."""
    return lookup_slots(with_absent_column(table), req, pos, block_size, tokens_per_entry)


def candidate_slots(
    table: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, ratio: int, width: int, block_size: int
) -> torch.Tensor:
    """``[T, width]`` compressed-pool slots of the entries query ``t`` may attend (``e < (pos+1)//ratio``),
    ``-1`` padding, from the ``compressed`` block table."""
    epb = block_size // ratio  # entries per block: entry e lives in block column e // epb at offset e % epb
    cols = torch.arange(width, dtype=torch.int64, device=pos.device)[None, :]
    column = (cols // epb).clamp(max=max(table.shape[1] - 1, 0))  # [1, C]; past a row's visible: masked below
    slots = table[req[:, None], column]  # the one [T, C] int64 tensor (an 8k prefill's ratio-1 table: 512 MB)
    slots.mul_(epb).add_(cols % epb)
    return slots.masked_fill_(cols >= ((pos + 1) // ratio)[:, None], -1)
