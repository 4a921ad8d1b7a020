"""Conformance cases for expert parallelism: ``MoEOps.dispatch`` and ``MoEOps.combine``, on one rank and on
two ranks over gloo (experts 1 and 4 replicated, physical slots that are not the logical ids, an idle rank).

What the contract fixes, and so what is compared: ``dispatch`` delivers every (token, top-k slot) pair
once, with its row unchanged and its *logical* expert id, to a rank that holds a replica of that expert
(which replica, and in which order rows arrive, is the platform's choice: the cases compare the delivered
pairs as a multiset, across ranks). ``combine`` returns each token's weighted sum of its pairs' expert
outputs: the cases run ``dispatch``, a made-up expert (``y = x * scale[id] + shift[id]``, exact in any
implementation) and ``combine``, and compare the sums.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from deepinfer_core.ops.moe import EPRouting
from deepinfer_core.testing.cases_dense import randn
from deepinfer_core.testing.opcase import OpCase
from deepinfer_core.testing.world import rank_and_world

E, K, D = 6, 3, 16
#: logical expert of each physical slot; on two ranks, slots 0-3 live on rank 0 and 4-7 on rank 1
PHY2LOG = (3, 1, 5, 4, 0, 2, 1, 4)


def routing(rank: int, world: int, phy2log: tuple[int, ...] = PHY2LOG) -> EPRouting:
    """One rank's :class:`EPRouting` for the placement ``phy2log`` over ``world`` ranks."""
    log2phy = torch.full((E, 2), -1, dtype=torch.int64)
    logcnt = torch.zeros(E, dtype=torch.int64)
    for slot, e in enumerate(phy2log):
        log2phy[e, logcnt[e]] = slot
        logcnt[e] += 1
    return EPRouting(rank, world, len(phy2log) // world, log2phy, logcnt)


def _tokens(g: torch.Generator, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(t)]) if t else torch.zeros(0, K)
    return randn(g, t, D), ids.long(), torch.rand((t, K), generator=g) + 0.1


def _ep_inputs(g: torch.Generator, idle: bool = False) -> tuple[tuple, dict]:
    """This rank's tokens (a different count per rank; none on the last rank if ``idle``), its routing, and
    the made-up experts' ``scale`` and ``shift`` (the same on every rank)."""
    rank, world = rank_and_world()
    x, ids, weights = _tokens(g, 0 if idle and rank == world - 1 else 5 + 2 * rank)
    experts = torch.Generator().manual_seed(77)
    scale, shift = randn(experts, E, D), randn(experts, E, D)
    return (x, ids, weights, routing(rank, world), scale, shift), {}


def _ep_inputs_idle(g: torch.Generator) -> tuple[tuple, dict]:
    return _ep_inputs(g, idle=True)


def _delivered(backends, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``dispatch``, then every rank's delivered ``(ids, rows)`` sorted by (id, row) as one multiset, and
    whether this rank only received experts it holds."""
    x, ids, _, ep, _, _ = args
    d = backends.moe.dispatch(x, ids, ep, backends.comm)
    slots = ep.log2phy[d.ids.long()]  # [N, replicas] physical slots of each delivered expert
    mine = (slots >= 0) & (slots // ep.slots_per_rank == ep.rank)
    pairs = [(d.ids.long().cpu(), d.x.cpu())]
    if ep.world > 1:
        pairs = [None] * ep.world
        dist.all_gather_object(pairs, (d.ids.long().cpu(), d.x.cpu()))
    got_ids, rows = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    order = torch.argsort(rows[:, 0], stable=True)
    order = order[torch.argsort(got_ids[order], stable=True)]
    return got_ids[order], rows[order], bool(mine.any(dim=1).all())


def _same_delivery(actual: tuple, expected: tuple, inputs: tuple) -> None:
    ids, rows, held = actual
    ref_ids, ref_rows, _ = expected
    assert held, "dispatch: this rank received experts it holds no replica of"
    assert ids.shape == ref_ids.shape, (
        f"dispatch: {ids.numel()} pairs delivered in all, not {ref_ids.numel()}"
    )
    assert torch.equal(ids, ref_ids), "dispatch: the delivered logical expert ids differ"
    assert torch.equal(rows, ref_rows), "dispatch: the delivered rows differ from the tokens' rows"


def _combined(backends, args: tuple, kwargs: dict) -> torch.Tensor:
    """``dispatch``, the made-up experts on the delivered rows, ``combine``: this rank's ``[T, D]`` sums."""
    x, ids, weights, ep, scale, shift = args
    d = backends.moe.dispatch(x, ids, ep, backends.comm)
    y = d.x * scale[d.ids.long()] + shift[d.ids.long()]
    return backends.moe.combine(y, ids, weights, d, ep, backends.comm)


def _case(op: str, name: str, make, world: int = 1) -> OpCase:
    if op == "dispatch":
        return OpCase("moe", op, name, make, run=_delivered, compare=_same_delivery, world=world)
    # combine adds K products in an order of its choosing
    return OpCase("moe", op, name, make, atol=1e-5, rtol=1e-5, run=_combined, world=world)


CASES = [
    _case("dispatch", "one_rank_replicas", _ep_inputs),
    _case("combine", "one_rank_replicas", _ep_inputs),
    _case("combine", "idle_rank", _ep_inputs_idle),
    _case("dispatch", "two_ranks_replicas", _ep_inputs, world=2),
    _case("combine", "two_ranks_replicas", _ep_inputs, world=2),
    _case("combine", "two_ranks_one_idle", _ep_inputs_idle, world=2),
]
