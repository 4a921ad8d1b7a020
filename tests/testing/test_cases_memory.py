"""The memory cases are valid: the reference passes those that apply to it, a platform that captures
graphs passes the capture case when its replay redoes the writes, and wrong memory ops fail."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch

from deepinfer_core.ops.reference.memory import ReferenceMemoryOps
from deepinfer_core.testing import cases_memory, check_case
from deepinfer_core.testing.kit import reference_backends

CASES = {c.id: c for c in cases_memory.CASES}
REFERENCE = reference_backends()
CAPTURE = CASES["memory.capture_graph[replay_redoes_writes]"]
RECAPTURE = CASES["memory.capture_graph[after_a_released_graph]"]


@pytest.mark.parametrize(
    "case", [c for c in cases_memory.CASES if c.op != "capture_graph"], ids=lambda c: c.id
)
def test_the_reference_passes(case):
    assert case.applies_to(REFERENCE)
    check_case(REFERENCE, case)


@pytest.mark.parametrize("case", [CAPTURE, RECAPTURE], ids=lambda c: c.id)
def test_the_capture_cases_apply_only_to_platforms_with_graphs(case):
    assert "supports_graphs is False" in case.skip_reason(REFERENCE)
    assert case.applies_to(dataclasses.replace(REFERENCE, memory=RerunningGraphs()))


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


class OneDeadPool(RerunningGraphs):
    """Every graph in one memory pool that cannot take a capture again once its graphs are all gone: the CUDA
    caching allocator's rule for a pool that still owns a live tensor (its ``use_count > 0`` assertion), met
    by ``cuda_sm100`` before its graphs shared a pool only while one of them was alive."""

    def __init__(self):
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.released = False

    def capture_graph(self, fn):
        if self.released and not self.live:
            raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED (a released pool)")
        fn()
        replay = Replay(fn)
        self.live.add(replay)
        weakref.finalize(replay, self._gone)
        return replay

    def _gone(self):
        self.released = True


class Replay:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self):
        return self.fn()


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


@pytest.mark.parametrize("case", [CAPTURE, RECAPTURE], ids=lambda c: c.id)
def test_graphs_whose_replay_redoes_the_writes_pass(case):
    check_case(dataclasses.replace(REFERENCE, memory=RerunningGraphs()), case)


def test_a_pool_that_outlives_its_graphs_fails_the_recapture():
    memory = OneDeadPool()
    check_case(dataclasses.replace(REFERENCE, memory=memory), CAPTURE)  # one graph: fine
    with pytest.raises(RuntimeError, match="use_count"):
        check_case(dataclasses.replace(REFERENCE, memory=OneDeadPool()), RECAPTURE)


@pytest.mark.parametrize(
    "wrong,case_id,message",
    [
        (FrozenGraphs(), CAPTURE.id, "Mismatched elements"),
        (NoGraphs(), CAPTURE.id, "capture_graph returned None"),
        (NoGraphs(), RECAPTURE.id, "capture_graph returned None"),
        (FrozenGraphs(), RECAPTURE.id, "Mismatched elements"),
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
