"""Expert-parallel load balancing (EPLB): turn per-expert load into a placement with redundant experts.

Follows the semantics of DeepSeek's published EPLB algorithm (facts, own code):

- *hierarchical* policy (when expert groups divide evenly over nodes): pack expert groups onto nodes so
  node loads are balanced; inside each node, give the heaviest experts extra replicas until the node
  has its share of physical slots; then pack the replicas onto the node's GPUs, balancing load.
- *global* policy: the same with one group and one node: replicate globally, then pack onto all GPUs.

A placement is ``phy2log [num_physical]`` (which logical expert each physical slot holds, slots
``g*per_gpu:(g+1)*per_gpu`` on GPU ``g``) plus ``log2phy`` / ``logcnt`` for routing a token to one of
an expert's replicas. All functions work on one layer; :func:`rebalance` maps over layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    phy2log: torch.Tensor  # [layers, num_physical] int64
    log2phy: torch.Tensor  # [layers, num_logical, max_replicas] int64, -1 padded
    logcnt: torch.Tensor  # [layers, num_logical] int64 replicas per logical expert


def balanced_packing(weights: torch.Tensor, num_packs: int) -> torch.Tensor:
    """Assign ``n`` items to ``num_packs`` packs of exactly ``n / num_packs`` items each, greedily
    heaviest-first into the currently lightest pack with room. Returns ``pack [n]``."""
    n = weights.numel()
    if n % num_packs:
        raise ValueError(f"{n} items do not split evenly into {num_packs} packs")
    per_pack = n // num_packs
    loads = [0.0] * num_packs
    counts = [0] * num_packs
    pack = torch.empty(n, dtype=torch.int64)
    for i in torch.argsort(weights.double(), descending=True, stable=True).tolist():
        p = min((q for q in range(num_packs) if counts[q] < per_pack), key=lambda q: (loads[q], q))
        pack[i] = p
        loads[p] += float(weights[i])
        counts[p] += 1
    return pack


def replicate(weights: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Spread ``n`` logical experts over ``num_slots >= n`` slots: every expert gets one, and each extra
    slot goes to the expert with the highest load per replica. Returns ``(slot2log [num_slots], count [n])``."""
    n = weights.numel()
    if num_slots < n:
        raise ValueError(f"{num_slots} physical slots cannot hold {n} experts")
    count = torch.ones(n, dtype=torch.int64)
    slot2log = list(range(n))
    w = weights.double()
    for _ in range(num_slots - n):
        e = int(torch.argmax(w / count))
        count[e] += 1
        slot2log.append(e)
    return torch.tensor(slot2log, dtype=torch.int64), count


def _layer_placement(
    load: torch.Tensor, num_physical: int, num_groups: int, num_nodes: int, num_gpus: int
) -> torch.Tensor:
    num_logical = load.numel()
    group_size = num_logical // num_groups
    group_node = balanced_packing(load.view(num_groups, group_size).sum(-1), num_nodes)
    slots_per_node = num_physical // num_nodes
    gpus_per_node = num_gpus // num_nodes
    phy2log = []
    for node in range(num_nodes):
        experts = torch.cat(
            [
                torch.arange(g * group_size, (g + 1) * group_size)
                for g in range(num_groups)
                if group_node[g] == node
            ]
        )
        slot2local, count = replicate(load[experts], slots_per_node)
        slot_load = load[experts][slot2local].double() / count[slot2local]
        gpu = balanced_packing(slot_load, gpus_per_node)
        order = torch.argsort(gpu * slots_per_node + torch.arange(slots_per_node), stable=True)
        phy2log.append(experts[slot2local[order]])
    return torch.cat(phy2log)


def rebalance(
    load: torch.Tensor, num_physical: int, num_groups: int, num_nodes: int, num_gpus: int
) -> Placement:
    """Placement for ``load [layers, num_logical]`` over ``num_gpus`` GPUs in ``num_nodes`` nodes.

    Uses the hierarchical policy when ``num_groups`` is a multiple of ``num_nodes``, else the global one."""
    layers, num_logical = load.shape
    if num_physical % num_gpus or num_gpus % num_nodes or num_logical % num_groups:
        raise ValueError(
            f"need num_physical ({num_physical}) % num_gpus ({num_gpus}) == 0, num_gpus % num_nodes ({num_nodes}) == 0 "
            f"and num_logical ({num_logical}) % num_groups ({num_groups}) == 0"
        )
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1  # global policy
    phy2log = torch.stack(
        [_layer_placement(load[i], num_physical, num_groups, num_nodes, num_gpus) for i in range(layers)]
    )
    logcnt = torch.stack([torch.bincount(phy2log[i], minlength=num_logical) for i in range(layers)])
    log2phy = torch.full((layers, num_logical, int(logcnt.max())), -1, dtype=torch.int64)
    for i in range(layers):
        fill = [0] * num_logical
        for slot, e in enumerate(phy2log[i].tolist()):
            log2phy[i, e, fill[e]] = slot
            fill[e] += 1
    return Placement(phy2log, log2phy, logcnt)


def gpu_loads(load: torch.Tensor, placement: Placement, num_gpus: int) -> torch.Tensor:
    """Expected load per GPU ``[layers, num_gpus]`` when each expert's tokens split evenly over its replicas."""
    layers, num_physical = placement.phy2log.shape
    per_slot = torch.gather(load.double(), 1, placement.phy2log) / torch.gather(
        placement.logcnt.double(), 1, placement.phy2log
    )
    return per_slot.view(layers, num_gpus, num_physical // num_gpus).sum(-1)


def imbalance(per_gpu: torch.Tensor) -> float:
    """max / mean load over GPUs, averaged over layers (1.0 is perfect balance)."""
    return float((per_gpu.max(-1).values / per_gpu.mean(-1).clamp_min(1e-12)).mean())


def static_placement(num_layers: int, num_logical: int, num_gpus: int) -> Placement:
    """Expert ``e`` on GPU ``e // (num_logical / num_gpus)``, no replicas: the placement before any rebalancing."""
    phy2log = torch.arange(num_logical).expand(num_layers, -1).contiguous()
    return Placement(
        phy2log, phy2log.unsqueeze(-1).clone(), torch.ones(num_layers, num_logical, dtype=torch.int64)
    )
