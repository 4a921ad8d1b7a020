"""DP votes on gloo with real processes: lock-step decisions, and a dead rank named within a timeout."""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer_core.distributed.vote import DPVoter, RankFailureError, Vote, decide


def test_decide_is_a_pure_function_of_the_votes():
    votes = torch.tensor([[0, 0, 1, 0], [5, 1, 0, 1]])
    d = decide(votes)
    assert d.run and d.max_tokens == 5 and d.any_prefill and not d.use_graph
    assert not decide(torch.tensor([[0, 0, 1, 0], [0, 0, 1, 0]])).run


def _worker(rank: int, world: int, port: int, script: list, result_dir: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=20))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=4)
    )
    voter = DPVoter(store=store)
    lines = []
    try:
        for step, work in enumerate(script[rank]):
            if work == "die":
                os._exit(3)
            t0 = time.monotonic()
            d = voter.exchange(Vote(num_tokens=work, is_prefill=False, graph_ok=True, has_work=work > 0))
            lines.append(f"{step} run={d.run} max={d.max_tokens}")
    except RankFailureError as e:
        lines.append(f"FAILED after {time.monotonic() - t0:.1f}s: {e}")
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines))
    # rank 0 hosts the store the others diagnose through: it leaves last
    survivors = sum("die" not in s for s in script)
    store.add("deepinfer/test/finished", 1)
    if rank == 0:
        while store.add("deepinfer/test/finished", 0) < survivors:
            time.sleep(0.01)
    os._exit(0)


def _run(script: list, tmp_path) -> list[str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.spawn(_worker, args=(len(script), port, script, str(tmp_path)), nprocs=len(script), join=False)
    for p in ctx.processes:
        p.join(60)
        assert not p.is_alive(), "a rank hung"
    return [
        (tmp_path / f"rank{r}.txt").read_text() if (tmp_path / f"rank{r}.txt").exists() else ""
        for r in range(len(script))
    ]


def test_ranks_agree_and_idle_ranks_still_run(tmp_path):
    out = _run([[3, 0, 0], [0, 2, 0]], tmp_path)
    assert out[0] == out[1] == "0 run=True max=3\n1 run=True max=2\n2 run=False max=0"


def test_a_dead_rank_is_named_and_nobody_hangs(tmp_path):
    out = _run([[1, 1, 1], [1, "die", 1], [1, 1, 1]], tmp_path)
    for r in (0, 2):
        assert "FAILED" in out[r] and "rank(s) [1] did not reach step 2" in out[r], out[r]
