"""``RowGraphs`` (the sampler's probs replayed per bucket of rows), with a CPU stand-in for the capture that, as
a CUDA graph, runs the op again on the bucket's static buffers at each replay."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.sampling import SamplingTensors

from .cuda_sm100_helpers import needs_triton, rand

pytestmark = needs_triton
REF = reference_op("sampling")


def _stand_in(counts: dict):
    def capture_on(device):
        def capture(fn):
            fn()  # the warm-up; a CUDA capture then records without running
            counts["captures"] += 1

            def replay():
                counts["replays"] += 1
                fn()

            return replay

        return capture

    return capture_on


def _params(gen, B: int) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.where(torch.rand(B, generator=gen) < 0.2, 0.0, torch.rand(B, generator=gen) + 0.3),
        top_k=torch.randint(-1, 40, (B,), generator=gen),
        top_p=torch.rand(B, generator=gen) * 0.6 + 0.4,
        min_p=torch.rand(B, generator=gen) * 0.1,
    )


def test_graphed_probs_match_the_reference_at_every_batch_and_keep_earlier_results(gen, monkeypatch):
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.ops import sampling

    monkeypatch.setattr(settings, "_active", settings.CudaSM100Settings(graphed_probs=True))
    counts = {"captures": 0, "replays": 0}
    ops = sampling.CudaSamplingOps(capture=_stand_in(counts))
    kept = []
    for B in (1, 3, 2, 4, 3, 5, 1):  # (under the interpreter a bucket of 16 rows took half the test's time)
        logits, params = rand(gen, B, 300, scale=3.0), _params(gen, B)
        got = ops.probs(logits, params)
        assert got.shape == (B, 300)
        torch.testing.assert_close(got, REF.probs(logits, params), atol=1e-6, rtol=1e-5)
        kept.append((got, got.clone()))
    assert all(torch.equal(a, b) for a, b in kept)  # a later call does not overwrite an earlier result
    assert counts["captures"] == 4  # buckets 1, 4, 2 and 8, once each
    assert counts["replays"] == 7


def test_rows_over_the_largest_bucket_and_empty_calls_run_eagerly(gen):
    from deepinfer_cuda_sm100.ops import sampling
    from deepinfer_cuda_sm100.ops.row_graphs import RowGraphs

    counts = {"captures": 0, "replays": 0}
    graphs = RowGraphs(sampling._probs, capture=_stand_in(counts), buckets=(1, 2))
    logits, params = rand(gen, 3, 50), _params(gen, 3)
    tensors = (params.temperature, params.top_k, params.top_p, params.min_p)
    got = graphs(logits, *tensors)
    torch.testing.assert_close(got, REF.probs(logits, params), atol=1e-6, rtol=1e-5)
    assert graphs(torch.empty(0, 50), *(v[:0] for v in tensors)).shape == (0, 50)
    assert counts == {"captures": 0, "replays": 0}


def test_a_bucket_keys_on_the_trailing_shape_and_dtypes(gen):
    from deepinfer_cuda_sm100.ops.row_graphs import RowGraphs

    counts = {"captures": 0, "replays": 0}
    graphs = RowGraphs(lambda x, w: x * w[:, None], capture=_stand_in(counts))
    a = graphs(rand(gen, 2, 8), rand(gen, 2))
    b = graphs(rand(gen, 2, 9), rand(gen, 2))
    c = graphs(rand(gen, 2, 8, dtype=torch.float64), rand(gen, 2))
    assert (a.shape, b.shape, c.dtype) == ((2, 8), (2, 9), torch.float64)
    assert counts["captures"] == 3


@pytest.mark.parametrize("on", [True, False])
def test_the_setting_picks_the_graphed_or_the_eager_probs(gen, monkeypatch, on):
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.ops import sampling

    counts = {"captures": 0, "replays": 0}
    monkeypatch.setattr(settings, "_active", settings.CudaSM100Settings(graphed_probs=on))
    ops = sampling.CudaSamplingOps(capture=_stand_in(counts))
    logits, params = rand(gen, 2, 64), _params(gen, 2)
    torch.testing.assert_close(ops.probs(logits, params), REF.probs(logits, params), atol=1e-6, rtol=1e-5)
    assert counts["replays"] == (1 if on else 0)


@pytest.mark.parametrize(
    "cuts", [(False, False, False), (False, True, True), (True, False, True), (True, True, False)]
)
def test_skipping_cuts_no_row_uses_gives_the_same_bits(gen, cuts):
    """``_probs`` with a cut skipped (``SamplingTensors.any_*`` False) on rows that all disable it: bit for bit
    the full computation, which runs that cut as an identity."""
    from deepinfer_cuda_sm100.ops import sampling

    B = 6
    params = _params(gen, B)
    top_k = params.top_k if cuts[0] else torch.where(torch.rand(B, generator=gen) < 0.5, 0, -1)
    top_p = params.top_p if cuts[1] else torch.ones(B)
    min_p = params.min_p if cuts[2] else torch.zeros(B)
    logits = rand(gen, B, 300, scale=3.0)
    full = sampling._probs(logits, params.temperature, top_k, top_p, min_p)
    skipped = sampling._probs(logits, params.temperature, top_k, top_p, min_p, cuts=cuts)
    assert torch.equal(full, skipped)
    ref = REF.probs(logits, SamplingTensors(params.temperature, top_k, top_p, min_p))
    torch.testing.assert_close(skipped, ref, atol=1e-6, rtol=1e-5)


def test_a_cut_skipped_while_a_row_uses_it_changes_the_result(gen):
    """The check above can fail: skipping top-p where rows use it gives other probabilities."""
    from deepinfer_cuda_sm100.ops import sampling

    params = _params(gen, 6)
    logits = rand(gen, 6, 300, scale=3.0)
    args = (logits, params.temperature, params.top_k, params.top_p, params.min_p)
    assert not torch.equal(sampling._probs(*args), sampling._probs(*args, cuts=(True, False, True)))
