"""The expert-parallel cases (MoE dispatch and combine, one rank and two gloo ranks) are valid: the
reference passes them, a dispatch that delivers rows differently but correctly passes too, and a
deliberately wrong dispatch or combine fails them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.ops.moe import Dispatched
from deepinfer_core.ops.reference import ReferenceMoEOps
from deepinfer_core.testing import cases_ep, check_case
from deepinfer_core.testing.kit import reference_backends, run_world

CASES = {c.id: c for c in cases_ep.CASES}
ONE_RANK = [c for c in cases_ep.CASES if c.world == 1]
TWO_RANKS = [c for c in cases_ep.CASES if c.world == 2]
REFERENCE = reference_backends()


def test_routing_lists_every_replica_of_each_expert():
    ep = cases_ep.routing(rank=1, world=2)
    assert ep.slots_per_rank == 4 and ep.logcnt.tolist() == [1, 2, 1, 1, 2, 1]
    assert ep.log2phy[1].tolist() == [1, 6] and ep.log2phy[4].tolist() == [3, 7]


@pytest.mark.parametrize("case", ONE_RANK, ids=lambda c: c.id)
def test_the_reference_passes_the_one_rank_cases(case):
    check_case(REFERENCE, case)


class ReversedDelivery(ReferenceMoEOps):
    """Delivers the same pairs in reverse order (allowed: the handle is opaque) and undoes it in combine."""

    def dispatch(self, x, ids, ep, comm):
        d = super().dispatch(x, ids, ep, comm)
        return Dispatched(d.x.flip(0), d.ids.flip(0), d.handle)

    def combine(self, y, ids, weights, dispatched, ep, comm):
        return super().combine(y.flip(0), ids, weights, dispatched, ep, comm)


def test_a_different_but_correct_delivery_order_passes():
    for case in ONE_RANK:
        check_case(dataclasses.replace(REFERENCE, moe=ReversedDelivery()), case)


class PhysicalIds(ReferenceMoEOps):
    """Labels delivered rows with their physical slot, not their logical expert."""

    def dispatch(self, x, ids, ep, comm):
        d = super().dispatch(x, ids, ep, comm)
        return Dispatched(d.x, ep.log2phy[d.ids, 0], d.handle)


class DropsAPair(ReferenceMoEOps):
    def dispatch(self, x, ids, ep, comm):
        d = super().dispatch(x, ids, ep, comm)
        return Dispatched(d.x[1:], d.ids[1:], d.handle)


class Unweighted(ReferenceMoEOps):
    def combine(self, y, ids, weights, dispatched, ep, comm):
        return super().combine(y, ids, torch.ones_like(weights), dispatched, ep, comm)


@pytest.mark.parametrize(
    "wrong,case_id",
    [
        (PhysicalIds(), "moe.dispatch[one_rank_replicas]"),
        (DropsAPair(), "moe.dispatch[one_rank_replicas]"),
        (Unweighted(), "moe.combine[one_rank_replicas]"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_a_wrong_op_fails_the_one_rank_case(wrong, case_id):
    with pytest.raises(AssertionError):
        check_case(dataclasses.replace(REFERENCE, moe=wrong), CASES[case_id])


class WrongRankAndMixedOutputs(ReferenceMoEOps):
    """Sends every pair to the next rank's slots (which hold other experts), and combines the expert
    outputs in the wrong rows."""

    def dispatch(self, x, ids, ep, comm):
        total = ep.slots_per_rank * ep.world
        shifted = torch.where(ep.log2phy >= 0, (ep.log2phy + ep.slots_per_rank) % total, -1)
        return super().dispatch(x, ids, dataclasses.replace(ep, log2phy=shifted), comm)

    def combine(self, y, ids, weights, dispatched, ep, comm):
        return super().combine(y.flip(0), ids, weights, dispatched, ep, comm)


def test_a_wrong_dispatch_and_combine_fail_the_two_rank_cases():
    """(The reference passes them in ``test_conformance_kit.py``.)"""
    wrong = run_world(
        dataclasses.replace(REFERENCE, moe=WrongRankAndMixedOutputs()), TWO_RANKS, None, 1234, 2
    )
    assert "received experts" in wrong[CASES["moe.dispatch[two_ranks_replicas]"]]
    for name in ("two_ranks_replicas", "two_ranks_one_idle"):
        failure = wrong[CASES[f"moe.combine[{name}]"]]
        assert failure is not None and f"moe.combine[{name}] on rank 0" in failure
