"""Expert parallelism: shard a model's routed experts over the EP ranks, count expert load, and apply
a new EPLB placement by moving expert weights between ranks.

Rank ``r`` holds physical slots ``r * P : (r + 1) * P`` of a :class:`~.eplb.Placement` (``P`` slots per
rank, logical expert ``phy2log[s]`` in slot ``s``). Attention and the shared expert stay replicated (DP
attention); only the routed experts are split. Moving weights uses the communication backend's
all-to-all, so the same code runs over gloo, NCCL or HCCL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from deepinfer_core.distributed.eplb import Placement, gpu_loads, imbalance, rebalance
from deepinfer_core.ops.comm import CommOps
from deepinfer_core.ops.moe import EPRouting
from deepinfer_core.ops.weights import ExpertWeights, QuantizedWeight, Weight


def moe_layers(model: object) -> list:
    """Every MoE module of a V4-style model (decoder blocks, then MTP blocks), in a fixed order. Blocks that set
    ``ep_sharded = False`` (V4.1's DSpark stages, with expert counts of their own) stay whole on every rank."""
    blocks = list(getattr(model, "layers", [])) + list(getattr(model, "mtp", []))
    blocks = [b for b in blocks if getattr(b, "ep_sharded", True)]
    return [b.ffn for b in blocks if getattr(getattr(b, "ffn", None), "routed", None) is not None]


def initial_placement(
    num_layers: int, num_logical: int, world: int, num_redundant: int, num_groups: int = 1, num_nodes: int = 1
) -> Placement:
    """The placement before any statistics: EPLB on a uniform load (``e // (E / world)`` without replicas)."""
    num_physical = num_logical + num_redundant
    if num_physical % world:
        raise ValueError(
            f"expert parallelism over {world} ranks needs n_routed_experts + num_redundant_experts "
            f"({num_logical} + {num_redundant}) to be a multiple of {world}"
        )
    return rebalance(torch.ones(num_layers, num_logical), num_physical, num_groups, num_nodes, world)


def _slots(placement: Placement, layer: int, rank: int, world: int) -> list[int]:
    per = placement.phy2log.shape[1] // world
    return placement.phy2log[layer, rank * per : (rank + 1) * per].tolist()


def _routing(placement: Placement, layer: int, rank: int, world: int, group: object | None) -> EPRouting:
    num_logical = placement.log2phy.shape[1]
    return EPRouting(
        rank=rank,
        world=world,
        slots_per_rank=placement.phy2log.shape[1] // world,
        log2phy=placement.log2phy[layer].clone(),
        logcnt=placement.logcnt[layer].clone(),
        group=group,
        load=torch.zeros(num_logical, dtype=torch.int64),
    )


def shard_model(
    model: object, placement: Placement, rank: int, world: int, group: object | None = None
) -> None:
    """Keep only this rank's slots of every MoE layer (every rank loaded all experts) and attach routing."""
    for i, moe in enumerate(moe_layers(model)):
        full = moe.routed
        index = {g: j for j, g in enumerate(full.expert_ids)}
        slots = _slots(placement, i, rank, world)
        moe.routed = ExpertWeights(
            w1=[full.w1[index[e]] for e in slots],
            w3=[full.w3[index[e]] for e in slots],
            w2=[full.w2[index[e]] for e in slots],
            expert_ids=slots,
        )
        moe.ep = _routing(placement, i, rank, world, group)


# ---------------------------------------------------------------------- moving weights


def _parts(w: Weight) -> list[torch.Tensor]:
    return [w.data, w.scale] if isinstance(w, QuantizedWeight) else [w]


def _rebuild(like: Weight, parts: list[torch.Tensor]) -> Weight:
    if isinstance(like, QuantizedWeight):
        return QuantizedWeight(parts[0], parts[1], like.format, like.shape, like.act_block)
    return parts[0]


def transfer_plan(old: list[int], new: list[int], world: int) -> list[list[list[int]]]:
    """``plan[src][dst]``: logical experts rank ``src`` sends to rank ``dst`` (in that order) so that
    ``dst`` holds its new slots. ``old`` / ``new`` are one layer's ``phy2log``; an expert is sent once per
    receiving rank, by the lowest rank that held it, and only when the receiver did not hold it."""
    per = len(old) // world
    held = [set(old[r * per : (r + 1) * per]) for r in range(world)]
    owner = {}
    for r in range(world):
        for e in sorted(held[r]):
            owner.setdefault(e, r)
    plan = [[[] for _ in range(world)] for _ in range(world)]
    for dst in range(world):
        for e in dict.fromkeys(new[dst * per : (dst + 1) * per]):
            if e not in held[dst]:
                plan[owner[e]][dst].append(e)
    return plan


def move_layer(
    moe: object, old: Placement, new: Placement, layer: int, rank: int, world: int, comm: CommOps
) -> None:
    """Re-home one layer's experts to ``new``: weights this rank lacks arrive by all-to-all."""
    group = moe.ep.group
    plan = transfer_plan(old.phy2log[layer].tolist(), new.phy2log[layer].tolist(), world)
    mine = {e: j for j, e in enumerate(moe.routed.expert_ids)}
    send = [len(plan[rank][d]) for d in range(world)]
    recv = [len(plan[s][rank]) for s in range(world)]
    arrived: dict[int, list[Weight]] = {}
    incoming = [e for s in range(world) for e in plan[s][rank]]
    for name in ("w1", "w3", "w2"):
        ws = getattr(moe.routed, name)
        like = ws[0]
        got = []
        for p, proto in enumerate(_parts(like)):
            out_rows = [_parts(ws[mine[e]])[p] for d in range(world) for e in plan[rank][d]]
            x = torch.stack(out_rows) if out_rows else proto.new_empty((0, *proto.shape))
            got.append(comm.all_to_all(x, send, recv, group))
        for i, e in enumerate(incoming):
            arrived.setdefault(e, []).append(_rebuild(like, [g[i].clone() for g in got]))
    slots = _slots(new, layer, rank, world)
    have = {e: [getattr(moe.routed, n)[j] for n in ("w1", "w3", "w2")] for e, j in mine.items()}
    have.update(arrived)
    moe.routed = ExpertWeights(
        w1=[have[e][0] for e in slots],
        w3=[have[e][1] for e in slots],
        w2=[have[e][2] for e in slots],
        expert_ids=slots,
    )
    routing = _routing(new, layer, rank, world, group)
    routing.load = moe.ep.load
    moe.ep = routing


# ---------------------------------------------------------------------- EPLB at run time


@dataclass
class EPLBStats:
    rebalances: int = 0
    imbalance_before: float | None = None  # max/mean GPU load of the last window under the old placement
    imbalance_after: float | None = None  # the same load under the new placement
    history: list[tuple[float, float]] = field(default_factory=list)


class ExpertParallel:
    """One rank's EP state: the current placement, load statistics and periodic rebalancing.

    ``eplb`` is the config dict: ``num_redundant_experts`` (default 0), ``interval_steps`` (0: never
    rebalance), and optionally ``num_groups`` (expert groups kept inside a node, default 1) and
    ``num_nodes`` (default: torchrun's host count). The hierarchical policy applies when the groups divide
    over the nodes, otherwise the global one."""

    def __init__(self, model: object, rank: int, world: int, comm: CommOps, eplb: dict | None, group=None):
        eplb = dict(eplb or {})
        unknown = set(eplb) - {"num_redundant_experts", "interval_steps", "num_groups", "num_nodes"}
        if unknown:
            raise ValueError(
                f"eplb has unknown keys {sorted(unknown)}; allowed: num_redundant_experts, interval_steps, "
                "num_groups, num_nodes"
            )
        self.model, self.rank, self.world, self.comm, self.group = model, rank, world, comm, group
        self.layers = moe_layers(model)
        self.num_logical = self.layers[0].routed.num_local_experts if self.layers else 0
        self.interval = int(eplb.get("interval_steps", 0))
        self.num_groups = int(eplb.get("num_groups", 1))
        self.num_nodes = int(eplb.get("num_nodes", _num_nodes(world)))
        self.placement = initial_placement(
            len(self.layers),
            self.num_logical,
            world,
            int(eplb.get("num_redundant_experts", 0)),
            self.num_groups,
            self.num_nodes,
        )
        shard_model(model, self.placement, rank, world, group)
        self.steps = 0
        self.stats = EPLBStats()

    def load(self) -> torch.Tensor:
        """``[layers, experts]`` token counts of this rank since the last rebalance."""
        return torch.stack([m.ep.load for m in self.layers])

    def after_step(self) -> None:
        """Called by every rank after every voted step; rebalances every ``interval_steps``."""
        self.steps += 1
        if self.interval and self.steps % self.interval == 0:
            self.rebalance()

    def rebalance(self, placement: Placement | None = None) -> Placement:
        """Collective: sum the load over ranks, compute (or take) a new placement, move the weights."""
        load = self.comm.all_reduce(self.load().double(), self.group)
        new = placement or rebalance(
            load, self.placement.phy2log.shape[1], self.num_groups, self.num_nodes, self.world
        )
        before = imbalance(gpu_loads(load, self.placement, self.world))
        after = imbalance(gpu_loads(load, new, self.world))
        for i, moe in enumerate(self.layers):
            move_layer(moe, self.placement, new, i, self.rank, self.world, self.comm)
            moe.ep.load.zero_()
        self.placement = new
        self.stats.rebalances += 1
        self.stats.imbalance_before, self.stats.imbalance_after = before, after
        self.stats.history.append((before, after))
        return new


def _num_nodes(world: int) -> int:
    """Hosts in the job: torchrun's ``WORLD_SIZE / LOCAL_WORLD_SIZE``, 1 for spawned ranks."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return max(1, world // local) if world % local == 0 else 1
