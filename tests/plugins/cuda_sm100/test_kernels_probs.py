"""The sort-free ``probs`` (``kernels/probs.py``: top-k and top-p by radix searches over chunks of a row) against
the reference op, under the interpreter in CI: random rows over several chunks, every cut alone and together, tie
groups cut across chunk boundaries (top-p) and ties at the k-th value (top-k), rows whose mass never reaches
``top_p``, greedy and masked rows."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.sampling import SamplingTensors

from .cuda_sm100_helpers import dev, needs_triton, rand

pytestmark = needs_triton
REF = reference_op("sampling")


@pytest.fixture
def kp(monkeypatch):
    from deepinfer_cuda_sm100.kernels import probs

    monkeypatch.setattr(probs, "PROBS_CHUNK", 256)  # rows of a few hundred tokens span several chunks
    return probs


def _run(kp, logits, temp, top_p, min_p, top_p_used=True, top_k=None):
    B = logits.shape[0]
    top_k = torch.zeros(B, dtype=torch.int64) if top_k is None else top_k
    got = kp.probs(
        *dev(logits, temp, top_k, top_p, min_p), top_k_used=bool((top_k > 0).any()), top_p_used=top_p_used
    )
    return got.cpu(), REF.probs(logits, SamplingTensors(temp, top_k, top_p, min_p))


@pytest.mark.parametrize(
    "chunk,dbits,compact",
    [
        (256, 3, 3),
        (4096, 3, 3),
        (256, 5, -1),
        (256, 3, -1),
        (256, 3, 0),
        (256, 3, "first"),
        (4096, 3, "first"),
    ],
)
def test_random_rows_match_the_reference(kp, gen, monkeypatch, chunk, dbits, compact):
    """Top-p's digits of 3 bits (the default) or 5, the tokens in range written out after pass 3 (the default), 0,
    or never (``check.py`` times these), or only the non-negligible ones in pass 0 (``probs_compact_first``)."""
    from deepinfer_cuda_sm100 import settings

    monkeypatch.setattr(kp, "PROBS_CHUNK", chunk)
    monkeypatch.setattr(kp, "DBITS_P", dbits)
    monkeypatch.setattr(kp, "COMPACT_P", 3 if compact == "first" else compact)
    monkeypatch.setattr(
        settings, "_active", settings.CudaSM100Settings(probs_compact_first=compact == "first")
    )
    B, V = 8, 1500
    logits = rand(gen, B, V, scale=4.0)
    logits[:, 100:1400:9] = 2.5  # a tie group of 145 tokens over every chunk
    temp = torch.tensor([1.0, 0.5, 2.0, 1.0, 0.8, 1.0, 1.2, 0.7])
    top_p = torch.tensor([1.0, 0.9, 0.999, 0.35, 0.95, 0.7, 0.6, 0.5])
    min_p = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.05, 0.01, 0.0, 0.3])
    got, ref = _run(kp, logits, temp, top_p, min_p)
    assert torch.equal(got > 0, ref > 0), "the same tokens survive every cut"
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    assert len(set((ref > 0).sum(1).tolist())) > 4, "the rows keep sets of different sizes"


@pytest.mark.parametrize("first", [True, False], ids=["compact_first", "default"])
def test_top_p_over_a_long_tail_next_to_the_negligible_tokens(kp, monkeypatch, first):
    """With ``probs_compact_first``, top-p's searches leave out the tokens at or below ``(1 - top_p) / 2V``
    (``_negligible``) and compact the rest in the first pass: rows whose cut falls inside a long tail of small tied
    tokens, with tokens just above and just below that bound, and a row of only negligible tokens but one, keep the
    reference's tokens (and without it)."""
    from deepinfer_cuda_sm100 import settings

    before = settings.active()
    monkeypatch.setattr(kp, "COMPACT_P", 3)  # off: compaction after pass 3; on: in pass 0
    settings.use(settings.CudaSM100Settings(probs_compact_first=first))
    try:
        _long_tail_rows_keep_the_reference_tokens(kp)
    finally:
        settings.use(before)


def _long_tail_rows_keep_the_reference_tokens(kp):
    V = 1500
    # row 0's cut half a tail token past 0.99, not on a token's edge (there float32 sums decide which side)
    top_p = torch.tensor([0.99 + 0.01 / (V - 10), 0.95, 0.9, 0.99], dtype=torch.float64).float()
    eps = 0.5 * (1 - top_p.double()) / V
    p = torch.zeros(4, V, dtype=torch.float64)
    p[:, :10] = 0.098  # ten likely tokens, 0.98 of the mass
    tail = torch.arange(10, V)
    p[0, tail] = 0.02 / len(tail)  # a tie group above the bound: the cut falls inside it
    p[1, tail[::2]], p[1, tail[1::2]] = eps[1] * 1.01, eps[1] * 0.99  # tokens on both sides of the bound
    p[2, tail[::3]] = 0.02 / len(tail[::3])
    p[3, :10] = 0.0
    p[3, 0] = 1.0 - (V - 1) * eps[3] * 0.9
    p[3, 1:] = eps[3] * 0.9  # all but one negligible
    p = p / p.sum(1, keepdim=True)
    logits = p.clamp_min(1e-300).log().float()
    temp, min_p = torch.ones(4), torch.zeros(4)
    got, ref = _run(kp, logits, temp, top_p, min_p)
    assert torch.equal(got > 0, ref > 0)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    kept = (ref > 0).sum(1).tolist()
    assert 10 < kept[0] < V and kept[3] == 1, kept


def test_a_cut_inside_a_tie_group_keeps_its_lowest_ids_across_chunks(kp):
    """Ten tokens tied at the top, spread over four chunks of 256: each holds ~0.0999, so top-p 0.35 keeps four,
    the four lowest ids, wherever their chunks are."""
    V = 1000
    logits = torch.full((2, V), -4.0)
    top = [900, 5, 300, 256, 255, 511, 700, 12, 999, 600]
    logits[:, top] = 4.0
    temp, top_p, min_p = torch.ones(2), torch.tensor([0.35, 0.95]), torch.zeros(2)
    got, ref = _run(kp, logits, temp, top_p, min_p)
    assert (got[0] > 0).nonzero().flatten().tolist() == [5, 12, 255, 256]
    assert torch.equal(got > 0, ref > 0)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_top_k_with_every_other_cut_matches_the_reference(kp, gen):
    """``k`` from 1 to past the vocabulary, alone and with top-p and min-p, on logits of both signs."""
    B, V = 8, 1100
    logits = rand(gen, B, V, scale=4.0) - 1.0
    temp = torch.tensor([1.0, 0.5, 2.0, 1.0, 0.8, 1.0, 1.2, 0.0])
    top_k = torch.tensor([1, 7, 300, 2000, 40, 0, 1099, 5])
    top_p = torch.tensor([1.0, 1.0, 0.9, 1.0, 0.6, 0.7, 1.0, 0.5])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.3])
    got, ref = _run(kp, logits, temp, top_p, min_p, top_k=top_k)
    assert torch.equal(got > 0, ref > 0), "the same tokens survive every cut"
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    assert (got[0] > 0).sum() == 1 and (got[1] > 0).sum() == 7 and (got[6] > 0).sum() == 1099


def test_top_k_keeps_every_tie_at_the_k_th_value(kp):
    """Equal logits across chunks: ``k`` inside the group keeps the whole group; negative and zero logits
    (``-0.0`` and ``0.0`` order as equal)."""
    V = 900
    logits = torch.full((3, V), -3.0)
    logits[:, [512, 7, 300, 3, 11]] = 2.0
    logits[:, [40, 41, 890]] = 0.0
    logits[:, 41] = -0.0
    temp, top_p, min_p = torch.ones(3), torch.ones(3), torch.zeros(3)
    got, ref = _run(kp, logits, temp, top_p, min_p, top_k=torch.tensor([2, 6, 8]))
    assert (got[0] > 0).sum() == 5 and (got[1] > 0).sum() == 8 and (got[2] > 0).sum() == 8
    assert torch.equal(got > 0, ref > 0)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_a_row_whose_mass_never_reaches_top_p_keeps_every_token(kp):
    """Three-token rows whose float32 probabilities sum to 0.99999988 in any order, ``top_p`` 0.99999994 (the
    largest float32 below 1): no bucket's mass reaches it, the search falls back to the smallest probability,
    and every token stays, as in the reference's cumulative sum."""
    logits = torch.tensor([[-1.561790943145752, 4.0643510818481445, 0.705579400062561],
                           [-3.038585662841797, -0.08921253681182861, -0.8668568134307861],
                           [3.525890350341797, -1.0263522863388062, -1.1614910364151]])  # fmt: skip
    tp = torch.full((3,), 0.99999994)
    assert bool((torch.softmax(logits, -1).sum(-1) < tp).all())
    got, ref = _run(kp, logits, torch.ones(3), tp, torch.zeros(3))
    assert bool((got > 0).all()) and bool((ref > 0).all())
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_min_p_alone_and_greedy_and_masked_rows(kp, gen):
    """No row uses top-p (the passes skipped); min-p's renormalising mass; a greedy row's one-hot at the first
    maximum; a row mostly masked to ``-inf`` (a grammar) with a tie at its maximum."""
    V = 600
    logits = rand(gen, 4, V, scale=3.0)
    logits[2, :] = float("-inf")
    logits[2, [17, 400, 401]] = torch.tensor([1.0, 3.0, 3.0])
    logits[3, [70, 20]] = 50.0  # greedy: ties at the max go to the lowest id
    temp = torch.tensor([1.0, 0.6, 1.0, 0.0])
    min_p = torch.tensor([0.2, 0.0, 0.0, 0.5])
    got, ref = _run(kp, logits, temp, torch.ones(4), min_p, top_p_used=False)
    assert torch.equal(got > 0, ref > 0)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    assert got[3].nonzero().flatten().tolist() == [20] and (got[2] > 0).nonzero().flatten().tolist() == [
        17,
        400,
        401,
    ]


def test_a_row_does_not_depend_on_the_batch(kp, gen):
    logits = rand(gen, 5, 900, scale=3.0)
    temp, top_p, min_p = (
        torch.full((5,), 0.8),
        torch.tensor([0.5, 0.9, 0.7, 0.95, 0.3]),
        torch.full((5,), 0.02),
    )
    top_k = torch.zeros(5, dtype=torch.int64)
    whole = kp.probs(*dev(logits, temp, top_k, top_p, min_p)).cpu()
    for b in range(5):
        alone = kp.probs(
            *dev(logits[b : b + 1], temp[b : b + 1], top_k[b : b + 1], top_p[b : b + 1], min_p[b : b + 1])
        )
        assert torch.equal(alone.cpu()[0], whole[b])


def test_the_ops_take_the_kernels_with_radix_probs_and_the_sorts_without(monkeypatch, gen):
    """``CudaSamplingOps.probs``: the radix kernels with ``radix_probs`` on, skipping the searches of cuts no row
    uses; the torch sorts with it off; the same distribution either way."""
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.kernels import probs as kp
    from deepinfer_cuda_sm100.ops.sampling import CudaSamplingOps

    calls = []
    real = kp.probs
    monkeypatch.setattr(kp, "probs", lambda *a, **k: calls.append(k) or real(*a, **k))
    logits = rand(gen, 3, 300, scale=3.0)
    rows = (torch.ones(3), torch.tensor([0, 5, 0]), torch.full((3,), 0.8), torch.zeros(3))
    want = REF.probs(logits, SamplingTensors(*rows))
    got = CudaSamplingOps().probs(dev(logits), SamplingTensors(*dev(*rows), True, True, False)).cpu()
    assert calls and all(c == {"top_k_used": True, "top_p_used": True} for c in calls)  # graphed: 3 on a GPU
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    radix_calls = len(calls)
    before = settings.active()
    settings.use(before.model_copy(update={"radix_probs": False}))
    try:
        got = CudaSamplingOps().probs(dev(logits), SamplingTensors(*dev(*rows))).cpu()
    finally:
        settings.use(before)
    assert len(calls) == radix_calls, "radix_probs off takes the sorts"
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("compact", [3, 0, -1])
def test_the_first_pass_in_the_softmax_kernel_gives_the_same_bits(kp, gen, monkeypatch, compact):
    """Top-p's first pass inside the softmax kernel (``FUSE_PASS0``) writes the partials the pass kernel writes, so
    every later pass and the result are the same bits as with the pass launched on its own."""
    monkeypatch.setattr(kp, "COMPACT_P", compact)
    B, V = 6, 1300
    logits = rand(gen, B, V, scale=4.0)
    logits[:, 7:1200:11] = 1.5  # a tie group in every chunk
    temp = torch.tensor([1.0, 0.6, 0.0, 1.3, 0.9, 1.0])
    top_p = torch.tensor([0.9, 0.5, 0.95, 0.99, 0.3, 1.0])
    min_p = torch.tensor([0.0, 0.02, 0.0, 0.0, 0.1, 0.0])
    out = {}
    for fuse in (True, False):
        monkeypatch.setattr(kp, "FUSE_PASS0", fuse)
        out[fuse], ref = _run(kp, logits, temp, top_p, min_p)
    assert torch.equal(out[True], out[False])
    assert torch.equal(out[True] > 0, ref > 0)
    assert len(set((ref > 0).sum(1).tolist())) > 3, "the rows keep sets of different sizes"
