"""Start the data-parallel ranks: spawned from one host process, or joined under ``torchrun``.

- **Single host** (no ``RANK`` / ``WORLD_SIZE`` in the environment): the calling process becomes rank 0
  and hosts the rendezvous :class:`torch.distributed.TCPStore`; ranks ``1 .. D-1`` are spawned with
  ``torch.multiprocessing`` (``spawn``) and join the same store. Everything listens on the loopback
  interface only: the store through a socket bound to 127.0.0.1, and gloo / NCCL through
  ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` set to the loopback interface (unless the user set
  them). The per-run secret of :mod:`.control` reaches the spawned ranks in their process arguments.
- **torchrun** (several hosts): every process is a rank; ``init_process_group`` reads ``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` (``env://``) and the default store carries the control
  messages, authenticated with ``dist_secret``, which every host must be given.

The process-group backend is the communication backend's ``dist_backend`` (gloo on the reference
platform, NCCL / HCCL from the device plugins). ``dist_timeout_s`` bounds every collective: a hung or
dead peer turns into an error after at most that long.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

LOOPBACK = "127.0.0.1"


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass
class DistContext:
    rank: int
    world: int
    store: dist.Store
    secret: str
    timeout_s: float
    #: spawned rank processes (index ``r - 1`` is rank ``r``); only on a single-host rank 0
    procs: list[Any] = field(default_factory=list)


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n == "lo"), None) or next((n for n in names if n.startswith("lo")), None)


def _use_loopback_transport() -> None:
    """Make gloo and NCCL bind their sockets to the loopback interface (single host only)."""
    iface = _loopback_interface()
    if iface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)


def init_rank(
    rank: int,
    world: int,
    port: int,
    backend: str,
    secret: str,
    timeout_s: float,
    listen_fd: int | None = None,
) -> DistContext:
    """Join (rank 0: host, on the listening socket ``listen_fd``, which the store takes over) the loopback
    TCP store at ``port`` and initialise the default process group."""
    _use_loopback_transport()
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        LOOPBACK,
        port,
        world,
        rank == 0,
        timeout=timeout,
        master_listen_fd=listen_fd,
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return DistContext(rank, world, store, secret, timeout_s)


def init_torchrun(world: int, backend: str, secret: str | None, timeout_s: float) -> DistContext:
    """Join the group torchrun set up; ``world`` must equal ``WORLD_SIZE``, and every rank needs the same
    ``secret``."""
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world:
        raise ValueError(
            f"data_parallel_size={world} but torchrun started WORLD_SIZE={env_world} processes; they must match"
        )
    if not secret:
        raise ValueError(
            "dist_secret is not set: under torchrun the ranks authenticate their control messages with a "
            "secret that every host must be given out of band (DEEPINFER_DIST_SECRET, at least 16 characters)"
        )
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method="env://", timeout=timeout)
    store = dist.PrefixStore("deepinfer", dist.distributed_c10d._get_default_store())
    return DistContext(dist.get_rank(), world, store, secret, timeout_s)


def spawn_ranks(
    world: int, backend: str, secret: str, timeout_s: float, target: Any, args: tuple
) -> DistContext:
    """Spawn ranks ``1 .. world-1`` running ``target(rank, world, port, backend, secret, timeout_s, *args)``
    and make the calling process rank 0, hosting the store on a loopback socket."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen(world * 4)
    port = listener.getsockname()[1]
    ctx = mp.start_processes(
        _spawned,
        args=(target, world, port, backend, secret, timeout_s, args),
        nprocs=world - 1,
        join=False,
        start_method="spawn",
    )
    out = init_rank(0, world, port, backend, secret, timeout_s, listener.detach())
    out.procs = list(ctx.processes)
    return out


def _spawned(
    index: int, target: Any, world: int, port: int, backend: str, secret: str, timeout_s: float, args: tuple
) -> None:
    target(index + 1, world, port, backend, secret, timeout_s, *args)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
