"""Conformance cases for the communication ops: every collective of ``CommOps`` in one process (where it
is the identity) and between two processes over gloo (uneven all-to-all with an empty split included).

A collective moves values without arithmetic (``all_reduce`` adds two values, which is exact in any
order), so every case compares exactly. The two-process inputs are module-level functions: they travel
to the ranks by pickling.
"""

from __future__ import annotations

import torch

from deepinfer_core.testing.cases_dense import randn
from deepinfer_core.testing.opcase import OpCase
from deepinfer_core.testing.world import rank_and_world

#: ``COUNTS[src][dst]``: rows rank ``src`` sends to rank ``dst`` (rank 1 sends nothing to rank 0)
COUNTS = ((2, 3), (0, 4))


def _rows(g: torch.Generator) -> tuple[tuple, dict]:
    return (randn(g, 5, 3),), {}


def _self_exchange(g: torch.Generator) -> tuple[tuple, dict]:
    return (randn(g, 5, 3), [5], [5]), {}


def _exchange(dtype: torch.dtype, g: torch.Generator) -> tuple[tuple, dict]:
    """This rank's rows for :data:`COUNTS`, split by destination rank."""
    rank, world = rank_and_world()
    send = [COUNTS[rank][dst] for dst in range(world)]
    recv = [COUNTS[src][rank] for src in range(world)]
    rows = randn(g, sum(send), 3)
    if dtype == torch.int64:
        rows = (rows * 1000).long()
    return (rows, send, recv), {}


def _exchange_float(g: torch.Generator) -> tuple[tuple, dict]:
    return _exchange(torch.float32, g)


def _exchange_int64(g: torch.Generator) -> tuple[tuple, dict]:
    return _exchange(torch.int64, g)


def _exact(op: str, name: str, make, world: int = 1) -> OpCase:
    return OpCase("comm", op, name, make, atol=0.0, rtol=0.0, world=world)


CASES = [
    _exact("all_gather", "one_process", _rows),
    _exact("all_reduce", "one_process", _rows),
    _exact("all_to_all", "one_process", _self_exchange),
    _exact("all_gather", "two_processes", _rows, world=2),
    _exact("all_reduce", "two_processes", _rows, world=2),
    _exact("all_to_all", "two_processes_uneven", _exchange_float, world=2),
    _exact("all_to_all", "two_processes_int64", _exchange_int64, world=2),
]
