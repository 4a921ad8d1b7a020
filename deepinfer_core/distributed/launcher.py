"""Start the data-parallel ranks: spawned from one host process, or joined under ``torchrun``.

- **Single host** (no ``RANK`` / ``WORLD_SIZE`` in the environment): the calling process becomes rank 0
  and hosts the rendezvous :class:`torch.distributed.TCPStore`; ranks ``1 .. D-1`` are spawned with
  ``torch.multiprocessing`` (``spawn``) and join the same store.
- **torchrun** (several hosts): every process is a rank; ``init_process_group`` reads ``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` (``env://``) and the default store carries the control
  messages.

The process-group backend is the communication backend's ``dist_backend`` (gloo on the reference
platform, NCCL / HCCL from the device plugins). ``DEEPINFER_DIST_TIMEOUT_S`` (default 120) bounds every
collective: a hung or dead peer turns into an error after at most that long.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def timeout_s() -> float:
    return float(os.environ.get("DEEPINFER_DIST_TIMEOUT_S", "120"))


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass
class DistContext:
    rank: int
    world: int
    store: dist.Store
    #: spawned rank processes (index ``r - 1`` is rank ``r``); only on a single-host rank 0
    procs: list[Any] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_rank(rank: int, world: int, port: int, backend: str, host: str = "127.0.0.1") -> DistContext:
    """Join (rank 0: host) the TCP store at ``host:port`` and initialise the default process group."""
    timeout = datetime.timedelta(seconds=timeout_s())
    store = dist.TCPStore(host, port, world, rank == 0, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return DistContext(rank, world, store)


def init_torchrun(world: int, backend: str) -> DistContext:
    """Join the group torchrun set up; ``world`` must equal ``WORLD_SIZE``."""
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world:
        raise ValueError(
            f"data_parallel_size={world} but torchrun started WORLD_SIZE={env_world} processes; they must match"
        )
    timeout = datetime.timedelta(seconds=timeout_s())
    dist.init_process_group(backend, init_method="env://", timeout=timeout)
    store = dist.PrefixStore("deepinfer", dist.distributed_c10d._get_default_store())
    return DistContext(dist.get_rank(), world, store)


def spawn_ranks(world: int, backend: str, target: Any, args: tuple) -> DistContext:
    """Spawn ranks ``1 .. world-1`` running ``target(rank, world, port, backend, *args)`` and make the
    calling process rank 0."""
    port = _free_port()
    ctx = mp.start_processes(
        _spawned,
        args=(target, world, port, backend, args),
        nprocs=world - 1,
        join=False,
        start_method="spawn",
    )
    out = init_rank(0, world, port, backend)
    out.procs = list(ctx.processes)
    return out


def _spawned(index: int, target: Any, world: int, port: int, backend: str, args: tuple) -> None:
    target(index + 1, world, port, backend, *args)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
