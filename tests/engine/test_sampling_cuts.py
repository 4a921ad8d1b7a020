"""What the host knows of a step's sampling rows (``SamplingTensors.any_*``): set from the requests' parameters by
the sampler and by the persistent batch, so a platform may skip a cut that no row uses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from deepinfer_core import SamplingParams
from deepinfer_core.engine.persistent_batch import PersistentBatch
from deepinfer_core.engine.sampler import sampling_tensors

CASES = [
    ([SamplingParams(temperature=0.7)], (False, False, False)),
    ([SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_k=5)], (True, False, False)),
    ([SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0.0)], (False, True, False)),
    ([SamplingParams(temperature=0.7, min_p=0.05)], (False, False, True)),
    ([SamplingParams(temperature=0.7, top_k=-1, top_p=1.0, min_p=0.0)], (False, False, False)),
]


@pytest.mark.parametrize("params,want", CASES)
def test_the_sampler_and_the_persistent_batch_say_which_cuts_a_row_uses(params, want):
    seqs = [
        SimpleNamespace(params=p, seq_id=i, block_tables={}, tables_version=0, sampling_seed=i)
        for i, p in enumerate(params)
    ]
    t = sampling_tensors(seqs)
    assert (t.any_top_k, t.any_top_p, t.any_min_p) == want
    pb = PersistentBatch([], 1, torch.device("cpu"))
    rows = pb.rows(seqs)
    t2 = pb.sampling_tensors(rows, torch.device("cpu"), [5] * len(rows))
    assert (t2.any_top_k, t2.any_top_p, t2.any_min_p) == want
    for a, b in zip(
        (t.temperature, t.top_k, t.top_p, t.min_p), (t2.temperature, t2.top_k, t2.top_p, t2.min_p)
    ):
        assert torch.equal(a, b)
