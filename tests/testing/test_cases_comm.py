"""The communication cases are valid: the reference passes the one-process cases (and the two-process
ones, in ``test_conformance_kit.py``), and collectives that are wrong in one process, or only between
processes, fail them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from deepinfer_core.ops.reference.comm import ReferenceCommOps
from deepinfer_core.testing import cases_comm, check_case
from deepinfer_core.testing.kit import reference_backends, run_world

ONE_PROCESS = {c.op: c for c in cases_comm.CASES if c.world == 1}
TWO_PROCESSES = [c for c in cases_comm.CASES if c.world == 2]
REFERENCE = reference_backends()


@pytest.mark.parametrize("case", list(ONE_PROCESS.values()), ids=lambda c: c.id)
def test_the_reference_passes_the_one_process_cases(case):
    check_case(REFERENCE, case)


class NotIdentities(ReferenceCommOps):
    """Collectives that act as if the process were its own peer."""

    def all_gather(self, x, group=None):
        return torch.cat([x, x])

    def all_reduce(self, x, group=None):
        return x.mul_(2)

    def all_to_all(self, x, send_counts, recv_counts, group=None):
        return x.flip(0)


@pytest.mark.parametrize("op", ["all_gather", "all_reduce", "all_to_all"])
def test_a_collective_that_is_not_the_identity_in_one_process_fails(op):
    with pytest.raises(AssertionError, match=rf"comm\.{op}\[one_process\]"):
        check_case(dataclasses.replace(REFERENCE, comm=NotIdentities()), ONE_PROCESS[op])


class RanksReversed(ReferenceCommOps):
    """Right in one process; between processes, ranks' rows arrive in reverse order and the sum is a mean."""

    def gather_into(self, out, x, group):
        super().gather_into(out, x, group)
        out.copy_(out.view(dist.get_world_size(group), *x.shape).flip(0).reshape(out.shape))

    def all_reduce(self, x, group=None):
        return super().all_reduce(x, group).div_(dist.get_world_size(group) if dist.is_initialized() else 1)

    def exchange_into(self, out, x, send_counts, recv_counts, group):
        super().exchange_into(out, x, send_counts, recv_counts, group)
        out.copy_(out.flip(0))


def test_collectives_wrong_only_between_processes_fail_the_two_process_cases():
    for case in ONE_PROCESS.values():
        check_case(dataclasses.replace(REFERENCE, comm=RanksReversed()), case)
    failures = run_world(dataclasses.replace(REFERENCE, comm=RanksReversed()), TWO_PROCESSES, None, 1234, 2)
    for case in TWO_PROCESSES:
        assert failures[case] is not None and f"{case.id} on rank" in failures[case], case.id
