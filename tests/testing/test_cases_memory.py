"""The memory cases are valid: the reference passes those that apply to it, a platform that captures
graphs passes the capture case when its replay redoes the writes, and wrong memory ops fail."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.ops.reference.memory import ReferenceMemoryOps
from deepinfer_core.testing import cases_memory, check_case
from deepinfer_core.testing.kit import reference_backends

CASES = {c.id: c for c in cases_memory.CASES}
REFERENCE = reference_backends()
CAPTURE = CASES["memory.capture_graph[replay_redoes_writes]"]


@pytest.mark.parametrize("case", [c for c in cases_memory.CASES if c is not CAPTURE], ids=lambda c: c.id)
def test_the_reference_passes(case):
    assert case.applies_to(REFERENCE)
    check_case(REFERENCE, case)


def test_the_capture_case_applies_only_to_platforms_with_graphs():
    assert "supports_graphs is False" in CAPTURE.skip_reason(REFERENCE)
    assert CAPTURE.applies_to(dataclasses.replace(REFERENCE, memory=RerunningGraphs()))


class RerunningGraphs(ReferenceMemoryOps):
    """Graphs as the contract asks: the replay redoes what ``fn`` did, on the buffers' current values."""

    supports_graphs = True

    def capture_graph(self, fn):
        fn()
        return fn


class FrozenGraphs(RerunningGraphs):
    """A replay that does nothing: what a capture that recorded no kernels would give."""

    def capture_graph(self, fn):
        fn()
        return lambda: None


class NoGraphs(RerunningGraphs):
    def capture_graph(self, fn):
        return None


class DirtyPools(ReferenceMemoryOps):
    def allocate(self, shape, dtype):
        return torch.ones(shape, dtype=dtype)


class Float32Pools(ReferenceMemoryOps):
    def allocate(self, shape, dtype):
        return torch.zeros(shape)


class FlatHostBuffers(ReferenceMemoryOps):
    def pinned_host_buffer(self, shape, dtype):
        return torch.empty(shape, dtype=dtype).flatten()


class FractionalBudget(ReferenceMemoryOps):
    def available_kv_bytes(self, gpu_memory_utilization, model_bytes):
        return super().available_kv_bytes(gpu_memory_utilization, model_bytes) / 3


class BudgetGrowsWithTheModel(ReferenceMemoryOps):
    def available_kv_bytes(self, gpu_memory_utilization, model_bytes):
        return super().available_kv_bytes(gpu_memory_utilization, 0) + model_bytes


def test_graphs_whose_replay_redoes_the_writes_pass():
    check_case(dataclasses.replace(REFERENCE, memory=RerunningGraphs()), CAPTURE)


@pytest.mark.parametrize(
    "wrong,case_id,message",
    [
        (FrozenGraphs(), CAPTURE.id, "Mismatched elements"),
        (NoGraphs(), CAPTURE.id, "capture_graph returned None"),
        (DirtyPools(), "memory.allocate[zeroed_pool]", "zero-filled"),
        (DirtyPools(), "memory.allocate[bf16_pool_on_device]", "Mismatched elements"),
        (Float32Pools(), "memory.allocate[uint8_rows_on_device]", "dtype"),
        (FlatHostBuffers(), "memory.pinned_host_buffer[round_trip_through_device]", r"gave \(120,\)"),
        (FractionalBudget(), "memory.available_kv_bytes[sane_budgets]", "not a byte count"),
        (BudgetGrowsWithTheModel(), "memory.available_kv_bytes[sane_budgets]", "a larger model gives more"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_wrong_memory_ops_fail(wrong, case_id, message):
    with pytest.raises(AssertionError, match=message):
        check_case(dataclasses.replace(REFERENCE, memory=wrong), CASES[case_id])
