"""Expert parallelism pieces: dispatch/combine equals the single-process MoE bit for bit, the transfer plan,
and moving expert weights between 2 gloo ranks for a new EPLB placement (plain and FP8 weights)."""

from __future__ import annotations

import datetime
import os
import socket
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer_core.distributed.ep import ExpertParallel, moe_layers, transfer_plan
from deepinfer_core.distributed.eplb import gpu_loads, imbalance, rebalance
from deepinfer_core.ops.moe import EPRouting
from deepinfer_core.ops.reference.comm import ReferenceCommOps
from deepinfer_core.ops.reference.moe import ReferenceMoEOps
from deepinfer_core.ops.weights import ExpertWeights, QuantizedWeight

E, D, INTER = 8, 16, 8


def _experts(seed: int = 0) -> ExpertWeights:
    g = torch.Generator().manual_seed(seed)

    def w(o, i):
        return torch.randn(o, i, generator=g) * i**-0.5

    return ExpertWeights(
        w1=[w(INTER, D) for _ in range(E)],
        w3=[w(INTER, D) for _ in range(E)],
        w2=[w(D, INTER) for _ in range(E)],
        expert_ids=list(range(E)),
    )


def test_dispatch_experts_combine_is_bit_identical_to_the_local_moe_with_replicas():
    ops, comm = ReferenceMoEOps(), ReferenceCommOps()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, D, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:3] for _ in range(7)])
    weights = torch.rand(7, 3, generator=g)
    experts = _experts()
    want = ops.experts(x, ids, weights, experts, 2.0)
    # one rank, 10 slots: experts 2 and 5 have a second replica
    pl = rebalance(torch.tensor([[1.0, 1, 9, 1, 1, 9, 1, 1]]), 10, 1, 1, 1)
    assert pl.logcnt[0, 2] == 2 and pl.logcnt[0, 5] == 2
    ep = EPRouting(0, 1, 10, pl.log2phy[0], pl.logcnt[0])
    d = ops.dispatch(x, ids, ep, comm)
    assert d.x.shape == (21, D)
    local = ExpertWeights(
        *[[getattr(experts, n)[e] for e in pl.phy2log[0].tolist()] for n in ("w1", "w3", "w2")],
        expert_ids=pl.phy2log[0].tolist(),
    )
    y = ops.experts(d.x, d.ids[:, None], torch.ones(21, 1), local, 2.0)
    got = ops.combine(y, ids, weights, d, ep, comm)
    assert torch.equal(got, want)
    empty = ops.dispatch(x[:0], ids[:0], ep, comm)  # an idle rank's empty batch
    assert ops.combine(empty.x[:0], ids[:0], weights[:0], empty, ep, comm).shape == (0, D)


def test_transfer_plan_sends_each_missing_expert_once_from_its_lowest_holder():
    old = [0, 1, 2, 3, 4, 5, 6, 7]  # rank 0: 0-3, rank 1: 4-7
    new = [0, 5, 5, 1, 4, 2, 3, 6]  # rank 0: 0,5,5,1   rank 1: 4,2,3,6 (7 dropped)
    plan = transfer_plan(old, new, 2)
    assert plan[1][0] == [5] and plan[0][1] == [2, 3]
    assert plan[0][0] == [] and plan[1][1] == []


def _fake_model(quantized: bool) -> SimpleNamespace:
    """Two MoE layers; layer 1's w2 are FP8 block-quantized weights (data + scale move together)."""
    layers = []
    for i in range(2):
        ex = _experts(seed=10 + i)
        if quantized and i == 1:
            ex.w2 = [
                QuantizedWeight(
                    w.to(torch.float8_e4m3fn), torch.full((1, 1), float(e + 1)), "fp8_block", tuple(w.shape)
                )
                for e, w in enumerate(ex.w2)
            ]
        layers.append(SimpleNamespace(ffn=SimpleNamespace(routed=ex, ep=None)))
    return SimpleNamespace(layers=layers, mtp=[])


def _ep_worker(rank: int, port: int, result_dir: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30)
    )
    model = _fake_model(quantized=True)
    full = [_fake_model(quantized=True).layers[i].ffn.routed for i in range(2)]
    ep = ExpertParallel(model, rank, 2, ReferenceCommOps(), {"num_redundant_experts": 2, "interval_steps": 0})
    lines = [f"slots {[m.routed.expert_ids for m in moe_layers(model)]}"]
    skew = torch.tensor([[2, 3, 5, 10, 10, 20, 50, 900], [1, 1, 1, 1, 2, 300, 400, 5]]) // 2
    for i, m in enumerate(moe_layers(model)):
        m.ep.load += skew[i]  # each rank saw half of the synthetic load
    ep.rebalance()
    ok = True
    for i, m in enumerate(moe_layers(model)):
        assert m.routed.expert_ids == ep.placement.phy2log[i, rank * 5 : rank * 5 + 5].tolist()
        for j, e in enumerate(m.routed.expert_ids):
            for n in ("w1", "w3", "w2"):
                a, b = getattr(m.routed, n)[j], getattr(full[i], n)[e]
                if isinstance(a, QuantizedWeight):
                    ok &= torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(
                        a.scale, b.scale
                    )
                else:
                    ok &= torch.equal(a, b)
        assert int(m.ep.load.sum()) == 0
    lines.append(f"weights_ok={ok}")
    lines.append(f"imbalance {ep.stats.imbalance_before:.4f} {ep.stats.imbalance_after:.4f}")
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines))
    dist.destroy_process_group()


def test_rebalancing_moves_weights_between_ranks_and_cuts_imbalance(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ep_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    out = [(tmp_path / f"rank{r}.txt").read_text().splitlines() for r in range(2)]
    for lines in out:
        assert lines[1] == "weights_ok=True"
    before, after = map(float, out[0][2].split()[1:])
    assert out[0][2] == out[1][2]  # every rank computed the same placement
    # fixed case: 8 experts, 2 ranks, 2 redundant slots, hot experts 7 (layer 0) and 5, 6 (layer 1)
    load = torch.tensor([[2.0, 3, 5, 10, 10, 20, 50, 900], [1, 1, 1, 1, 2, 300, 400, 5]]) // 2 * 2

    assert abs(before - imbalance(gpu_loads(load, rebalance(torch.ones(2, 8), 10, 1, 1, 2), 2))) < 1e-4
    # layer 0: the hot expert 7 has no replica at first (932 vs 66 tokens); layer 1: 402 vs 304
    assert round(before, 3) == 1.503 and round(after, 3) == 1.111  # 26% lower


def test_requests_go_to_the_least_loaded_rank_in_input_order():
    from deepinfer_core.engine.dp_engine import assign_by_load

    def item(n_prompt: int, max_tokens: int, n: int = 1):
        return SimpleNamespace(token_ids=[0] * n_prompt, params=SimpleNamespace(max_tokens=max_tokens, n=n))

    items = [item(100, 10), item(5, 5), item(5, 5), item(20, 5, n=2), item(1, 1)]
    shares = assign_by_load(items, 2, 512)
    assert [[rid for rid, _ in s] for s in shares] == [["0"], ["1", "2", "3", "4"]]
    assert [[rid for rid, _ in s] for s in assign_by_load(items[1:3], 3, 512)] == [["0"], ["1"], []]
