"""EPLB placement: valid layouts, fewer overloaded GPUs, and the packing/replication primitives."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.distributed.eplb import (
    balanced_packing,
    gpu_loads,
    imbalance,
    rebalance,
    replicate,
    static_placement,
)


def skewed_load(layers: int, experts: int, seed: int = 0) -> torch.Tensor:
    """Zipf-like expert popularity, shuffled per layer (a realistic skew: a few hot experts)."""
    g = torch.Generator().manual_seed(seed)
    base = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** 1.2
    return torch.stack([base[torch.randperm(experts, generator=g)] * 10000 for _ in range(layers)]).round()


def test_balanced_packing_fills_every_pack_equally_and_balances():
    w = torch.tensor([10.0, 9, 8, 7, 1, 1, 1, 1])
    pack = balanced_packing(w, 4)
    assert torch.bincount(pack, minlength=4).tolist() == [2, 2, 2, 2]
    loads = torch.zeros(4).index_add_(0, pack, w)
    assert loads.max() - loads.min() <= 3


def test_replicate_gives_extra_slots_to_the_hottest_experts():
    slot2log, count = replicate(torch.tensor([100.0, 10, 10, 10]), 6)
    assert count.tolist() == [3, 1, 1, 1]
    assert sorted(slot2log.tolist()) == [0, 0, 0, 1, 2, 3]


@pytest.mark.parametrize("num_groups, num_nodes", [(4, 2), (3, 2)])  # hierarchical, then global fallback
def test_placement_is_a_valid_layout(num_groups, num_nodes):
    experts = 12 if num_groups == 3 else 16
    load = skewed_load(3, experts)
    pl = rebalance(load, num_physical=experts + 4, num_groups=num_groups, num_nodes=num_nodes, num_gpus=4)
    assert pl.phy2log.shape == (3, experts + 4)
    for layer in range(3):
        assert set(pl.phy2log[layer].tolist()) == set(range(experts))  # every expert placed
        assert int(pl.logcnt[layer].sum()) == experts + 4
        for e in range(experts):
            slots = [s for s in pl.log2phy[layer, e].tolist() if s >= 0]
            assert len(slots) == pl.logcnt[layer, e] and all(pl.phy2log[layer, s] == e for s in slots)


def test_rebalancing_a_skewed_load_cuts_imbalance():
    """Fixed case: 64 experts, 8 GPUs, 16 redundant slots, Zipf(1.2) load."""
    load = skewed_load(4, 64, seed=1)
    before = imbalance(gpu_loads(load, static_placement(4, 64, 8), 8))
    after = imbalance(gpu_loads(load, rebalance(load, 80, num_groups=8, num_nodes=1, num_gpus=8), 8))
    assert before > 2.0  # the static layout has a badly overloaded GPU
    assert after < 1.15  # the rebalanced one is within 15% of perfect
    assert after < before / 2


def test_bad_geometry_is_rejected_with_the_numbers():
    with pytest.raises(ValueError, match="num_physical"):
        rebalance(torch.ones(1, 8), num_physical=9, num_groups=1, num_nodes=1, num_gpus=2)
