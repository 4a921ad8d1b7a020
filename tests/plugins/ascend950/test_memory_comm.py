"""Memory and communication ops of ascend950 under the stand-in's fake ``torch.npu``: memory sizing,
allocation, the ACL-graph capture protocol and its switch, and the HCCL-backed collectives' plumbing
(run here over gloo). The stand-in cannot capture or replay device kernels."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer_ascend950.ops.comm import AscendCommOps
from deepinfer_core.config import load_config


def memory_ops(enforce_eager: bool = False):
    from deepinfer_ascend950.plugin import deepinfer_memory_ops

    return deepinfer_memory_ops(platform="ascend950", config=load_config(enforce_eager=enforce_eager))


def test_kv_budget_is_utilisation_of_total_minus_what_is_in_use(standin, monkeypatch):
    monkeypatch.setattr(torch, "npu", standin.make_npu_namespace(free=40 << 30, total=64 << 30))
    assert memory_ops().available_kv_bytes(0.9, model_bytes=10 << 30) == int((64 << 30) * 0.9) - (24 << 30)
    assert memory_ops().available_kv_bytes(0.3, model_bytes=0) == 0


def test_allocate_gives_zeroed_pools_on_the_mapped_device(standin):
    pool = memory_ops().allocate((3, 5, 8), torch.bfloat16)
    assert pool.device == torch.device("cpu") and pool.dtype == torch.bfloat16
    assert pool.shape == (3, 5, 8) and torch.count_nonzero(pool) == 0
    assert memory_ops().pinned_host_buffer((4,), torch.int64).shape == (4,)


def test_capture_graph_warms_up_captures_and_returns_replay(standin):
    runs = []
    replay = memory_ops().capture_graph(lambda: runs.append(1))
    assert len(runs) == 2, "one warm-up run on a side stream, one run under torch.npu.graph"
    (graph,) = torch.npu.graphs
    assert graph.captured
    replay()
    replay()
    assert graph.replays == 2 and len(runs) == 2


@pytest.mark.parametrize("eager,env", [(True, None), (False, "0")])
def test_capture_graph_is_off_with_enforce_eager_or_the_env_var(standin, monkeypatch, eager, env):
    if env is not None:
        monkeypatch.setenv("DEEPINFER_ASCEND950__GRAPHS", env)
    runs = []
    assert memory_ops(enforce_eager=eager).capture_graph(lambda: runs.append(1)) is None
    assert runs == [] and torch.npu.graphs == []


def test_single_process_collectives_are_identities():
    comm = AscendCommOps()
    x = torch.randn(3, 4)
    assert comm.dist_backend == "hccl"
    assert comm.all_gather(x) is x and comm.all_reduce(x) is x and comm.all_to_all(x, [3], [3]) is x


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        comm = AscendCommOps()
        x = torch.full((2, 3), float(rank + 1))
        gathered = comm.all_gather(x)
        reduced = comm.all_reduce(x.clone())
        send = [1, 2] if rank == 0 else [3, 1]
        recv = [1, 3] if rank == 0 else [2, 1]
        rows = torch.arange(sum(send), dtype=torch.float32)[:, None] + 10 * rank
        out[rank] = (gathered, reduced, comm.all_to_all(rows, send, recv))
    finally:
        dist.destroy_process_group()


def test_collectives_across_two_processes_over_gloo():
    """The same torch.distributed calls the plugin makes on HCCL, checked over gloo on the CPU."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(2, port, out), nprocs=2, join=True)
    for rank in (0, 1):
        gathered, reduced, a2a = out[rank]
        assert torch.equal(gathered, torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)]))
        assert torch.equal(reduced, torch.full((2, 3), 3.0))
    assert out[0][2].flatten().tolist() == [0.0, 10.0, 11.0, 12.0]
    assert out[1][2].flatten().tolist() == [1.0, 2.0, 13.0]
