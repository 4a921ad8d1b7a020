"""The graph cache's input copies: each captured buffer gets its new value, grouped by dtype, and a step that
passes a buffer itself leaves it alone."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.engine.graphs import GraphCache, copy_inputs
from deepinfer_core.ops.reference.memory import ReferenceMemoryOps


def test_copy_inputs_fills_every_buffer_across_dtypes():
    g = torch.Generator().manual_seed(3)
    dsts = [
        torch.zeros(5, dtype=torch.int64),
        torch.zeros(2, 3),
        torch.zeros(4, dtype=torch.int64),
        torch.zeros(2, 2, dtype=torch.bool),
    ]
    srcs = [torch.randint(-9, 9, (5,), generator=g), torch.randn(2, 3, generator=g),
            torch.randint(0, 99, (4,), generator=g), torch.rand(2, 2, generator=g) > 0.5]  # fmt: skip
    keep = [d.data_ptr() for d in dsts]
    copy_inputs(dsts, srcs)
    for d, s in zip(dsts, srcs, strict=True):
        assert torch.equal(d, s)
    assert [
        d.data_ptr() for d in dsts
    ] == keep  # in place: the captured buffers stay where the graph reads them


def test_copy_inputs_skips_a_buffer_passed_as_itself_and_rejects_a_count_mismatch():
    buf = torch.arange(4)
    copy_inputs([buf], [buf])
    assert torch.equal(buf, torch.arange(4))
    with pytest.raises(ValueError, match="2 inputs for a step captured with 1"):
        copy_inputs([buf], [buf, buf])


class Rerun(ReferenceMemoryOps):
    supports_graphs = True

    def capture_graph(self, fn):
        fn()
        return fn


def test_a_replay_reads_the_new_inputs():
    cache = GraphCache(Rerun())
    a, b = torch.tensor([1, 2, 3]), torch.tensor([0.5, 1.5])
    out = cache.run("k", lambda: (a * 2, b + 1), [a, b], None)
    assert torch.equal(out[0], torch.tensor([2, 4, 6]))
    out = cache.run("k", lambda: (a * 2, b + 1), [torch.tensor([7, 8, 9]), torch.tensor([-1.0, 2.0])], None)
    assert torch.equal(out[0], torch.tensor([14, 16, 18])) and torch.equal(out[1], torch.tensor([0.0, 3.0]))
