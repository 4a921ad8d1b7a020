"""Conformance cases that need several processes: a gloo group of ``case.world`` ranks on this host's CPU.

Each rank runs the case on the platform's backends and on the reference ops with inputs of its own
(``seed + rank``; a case's ``make_inputs`` may read :func:`rank_and_world`), and compares its own results.
Starting a group costs seconds, so the first multi-process case checked for a platform's backends runs
every multi-process case of the kit in one group; the answers are kept for the rest of the process.

A rank whose op raises stops there (the other ranks would wait in a collective it skipped): its peers
time out after :data:`TIMEOUT_S`, and the cases not reached are reported as not run.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from deepinfer_core.testing.opcase import OpCase

TIMEOUT_S = 60


@dataclass(frozen=True)
class WorldFns:
    """What a rank runs, from the conformance kit (:mod:`deepinfer_core.testing.kit`, which imports this module
    and hands these in: this module never imports the kit). Module-level functions, so the spawned ranks
    receive them by name."""

    all_cases: Callable[[], list[OpCase]]
    reference_backends: Callable[[], Any]
    outcomes: Callable[..., tuple[Any, Any, Any]]
    compare_outcomes: Callable[..., None]


_RESULTS: dict[tuple, tuple[Any, Any, dict[OpCase, str | None]]] = {}


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of the current group; ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def world_failure(backends: Any, case: OpCase, reference: Any, seed: int, fns: WorldFns) -> str | None:
    """What went wrong with ``case`` on ``backends`` (``None``: it conforms), running the kit's cases of
    the same world size in one group the first time."""
    key = (id(backends), id(reference), seed, case.world)
    _, _, results = _RESULTS.setdefault(key, (backends, reference, {}))
    if case not in results:
        batch = (
            []
            if results
            else [c for c in fns.all_cases() if c.world == case.world and c.applies_to(backends)]
        )
        batch += [] if case in batch else [case]
        results.update(run_world(backends, batch, reference, seed, case.world, fns))
    return results[case]


def run_world(
    backends: Any, cases: list[OpCase], reference: Any, seed: int, world: int, fns: WorldFns
) -> dict[OpCase, str | None]:
    """Run ``cases`` in a new group of ``world`` processes; ``{case: failure or None}``."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        args = (world, port, backends, reference, cases, seed, tmp, fns)
        mp.spawn(_rank_main, args=args, nprocs=world, join=True)
        per_rank = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.pkl"), "rb") as f:
                per_rank.append(pickle.load(f))
    out = {}
    for i, case in enumerate(cases):
        failures = [msgs[i] for msgs in per_rank if msgs[i] is not None]
        out[case] = "\n".join(failures) if failures else None
    return out


def _rank_main(
    rank: int,
    world: int,
    port: int,
    backends: Any,
    reference: Any,
    cases: list[OpCase],
    seed: int,
    out: str,
    fns: WorldFns,
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    results: list[str | None] = []
    try:
        ref = reference if reference is not None else fns.reference_backends()
        for case in cases:
            failure, fatal = _check_rank(backends, case, ref, seed + 7919 * rank, rank, fns)
            results.append(failure)
            if fatal:
                break
        results += [f"rank {rank}: not run: an earlier case raised"] * (len(cases) - len(results))
    finally:
        with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
        dist.destroy_process_group()


def _check_rank(
    backends: Any, case: OpCase, reference: Any, seed: int, rank: int, fns: WorldFns
) -> tuple[str | None, bool]:
    """``(failure, fatal)`` of one case on this rank; fatal when an op raised (the group is out of step)."""
    try:
        result = fns.outcomes(backends, case, reference, seed)
    except Exception as e:  # noqa: BLE001 - reported as the case's failure
        return f"{case.id} on rank {rank} raised {type(e).__name__}: {e}", True
    try:
        fns.compare_outcomes(case, *result)
    except AssertionError as e:
        return f"{case.id} on rank {rank}: {e}", False
    return None, False
