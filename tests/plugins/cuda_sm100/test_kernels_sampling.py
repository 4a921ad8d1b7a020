"""Sampling ops: Triton penalties, bitmask and keyed draw, torch-on-device probs and rejection, vs the reference."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops import draws
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.sampling import SamplingTensors

from .cuda_sm100_helpers import dev, needs_triton, rand

pytestmark = needs_triton
REF = reference_op("sampling")


@pytest.fixture(scope="module")
def ops():
    from deepinfer_cuda_sm100.ops.sampling import CudaSamplingOps

    return CudaSamplingOps()


def test_penalties_match_reference(ops, gen):
    B, V = 3, 300
    logits = rand(gen, B, V, scale=3.0)
    mask = torch.rand(B, V, generator=gen) < 0.2
    counts = torch.randint(0, 3, (B, V), generator=gen) * (torch.rand(B, V, generator=gen) < 0.1)
    pres, freq, rep = (
        torch.tensor([0.0, 0.5, 1.0]),
        torch.tensor([0.3, 0.0, 0.2]),
        torch.tensor([1.0, 1.3, 0.8]),
    )
    got = ops.apply_penalties(*dev(logits, mask, counts, pres, freq, rep))
    torch.testing.assert_close(got.cpu(), REF.apply_penalties(logits, mask, counts, pres, freq, rep))


def test_bitmask_matches_reference(ops, gen):
    B, V = 2, 100  # 100 tokens: a partial last word
    logits = rand(gen, B, V)
    bits = torch.randint(-(2**31), 2**31 - 1, (B, 4), generator=gen, dtype=torch.int64).to(torch.int32)
    got = ops.apply_bitmask(*dev(logits, bits)).cpu()
    assert torch.equal(got, REF.apply_bitmask(logits, bits))
    assert torch.isneginf(got).any() and torch.isfinite(got).any()


def _params(B):
    return SamplingTensors(
        temperature=torch.tensor([0.0, 0.7, 1.0, 1.3, 0.9])[:B],
        top_k=torch.tensor([0, 5, -1, 50, 20])[:B],
        top_p=torch.tensor([1.0, 0.9, 0.5, 1.0, 0.8])[:B],
        min_p=torch.tensor([0.0, 0.0, 0.1, 0.05, 0.0])[:B],
    )


def test_probs_match_reference(ops, gen):
    logits = rand(gen, 5, 200, scale=3.0)
    params = _params(5)
    got = ops.probs(dev(logits), SamplingTensors(*dev(*vars(params).values())))
    torch.testing.assert_close(got.cpu(), REF.probs(logits, params), atol=1e-6, rtol=1e-5)


def _keys(gen, b):
    return torch.randint(0, 2**63 - 1, (b,), generator=gen), torch.randint(0, 2**40, (b,), generator=gen)


@pytest.mark.parametrize("V", [64, 4095, 4096, 9001])  # one block, a ragged block, exactly one, three
def test_keyed_draw_is_the_core_draw(ops, gen, V):
    """The Triton draw computes the core's keyed uniforms: the same token as ``draws.draw`` in every row."""
    probs = rand(gen, 6, V).softmax(-1)
    probs[:, ::3] = 0.0
    seeds, at = _keys(gen, 6)
    got = ops.sample_keyed(*dev(probs, seeds, at))
    assert torch.equal(got.cpu(), draws.draw(probs, seeds, at))


def test_keyed_draw_with_empty_chunks_is_the_core_draw(ops, gen):
    """A row split over 4096-token chunks, most of them all zeros (a top-k row): the chunk that holds the row's
    uniform finds the token, whichever chunk that is; every row equals the core's draw."""
    B, V = 12, 20000
    probs = torch.zeros(B, V)
    for b in range(B):
        keep = torch.randperm(V, generator=gen)[: 1 + b * 3]
        probs[b, keep] = torch.rand(len(keep), generator=gen) + 0.01
    seeds, at = _keys(gen, B)
    got = ops.sample_keyed(*dev(probs, seeds, at)).cpu()
    assert torch.equal(got, draws.draw(probs, seeds, at))
    assert bool((probs.gather(1, got[:, None]) > 0).all())


def test_keyed_draw_of_degenerate_rows(ops, gen):
    """Rows that are all zeros but one token (any scale), and a row of zeros (token 0, as the core draws)."""
    probs = torch.zeros(3, 5000)
    probs[0, 4321] = 1.0
    probs[1, 17] = 0.5
    seeds, at = _keys(gen, 3)
    assert ops.sample_keyed(*dev(probs, seeds, at)).cpu().tolist() == [4321, 17, 0]


def test_keyed_draw_rows_are_independent_of_the_batch(ops, gen):
    probs = rand(gen, 5, 300).softmax(-1)
    seeds, at = _keys(gen, 5)
    whole = ops.sample_keyed(*dev(probs, seeds, at)).cpu()
    alone = torch.cat(
        [ops.sample_keyed(*dev(probs[b : b + 1], seeds[b : b + 1], at[b : b + 1])).cpu() for b in range(5)]
    )
    assert torch.equal(whole, alone)


def test_argmax_ties_go_to_lowest_id(ops):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert ops.argmax(dev(logits)).cpu().tolist() == [1, 0]


def test_rejection_all_accepted_matches_reference(ops, gen):
    """Target = draft: every draft is accepted and the bonus token comes from the last target row."""
    B, k, V = 3, 4, 32
    target = rand(gen, B, k + 1, V).softmax(-1)
    draft_ids = torch.randint(0, V, (B, k), generator=gen)
    draft = target[:, :k].clone()
    seeds, at = _keys(gen, B)
    tok, n = ops.rejection_sample_keyed(*dev(draft_ids, draft, target, seeds, at))
    rtok, rn = REF.rejection_sample_keyed(draft_ids, draft, target, seeds, at)
    assert n.cpu().tolist() == [k] * B == rn.tolist()
    assert torch.equal(tok.cpu(), rtok)


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_matches_the_reference_row_by_row(ops, gen, one_hot):
    """Random targets and drafts drawn from ``q``: the same acceptances, residual draws and bonus tokens as the
    reference's row-at-a-time walk (its final draws are the Triton draw)."""
    B, k, V = 24, 3, 50
    draft = rand(gen, B, k, V, scale=2.0).softmax(-1)
    draft_ids = torch.multinomial(draft.reshape(-1, V), 1, generator=gen).view(B, k)
    bump = (
        torch.nn.functional.one_hot(draft_ids, V).float() * 3.0
    )  # the target likes the drafts: some accepted
    target = (rand(gen, B, k + 1, V, scale=2.0) + torch.cat([bump, torch.zeros(B, 1, V)], 1)).softmax(-1)
    q = None if one_hot else draft
    seeds, at = _keys(gen, B)
    tok, n = ops.rejection_sample_keyed(*dev(draft_ids, q, target, seeds, at))
    rtok, rn = REF.rejection_sample_keyed(draft_ids, q, target, seeds, at)
    assert torch.equal(n.cpu(), rn) and torch.equal(tok.cpu(), rtok)
    assert 0 < int(rn.sum()) < B * k  # both acceptances and rejections were exercised


def test_rejection_of_impossible_draft_resamples_elsewhere(ops, gen):
    B, k, V = 4, 3, 16
    target = rand(gen, B, k + 1, V).softmax(-1)
    draft_ids = torch.randint(0, V, (B, k), generator=gen)
    target[torch.arange(B), 0, draft_ids[:, 0]] = 0.0  # the first draft can never be accepted
    tok, n = ops.rejection_sample_keyed(*dev(draft_ids, None, target, *_keys(gen, B)))
    assert n.cpu().tolist() == [0] * B
    assert (tok[:, 0].cpu() != draft_ids[:, 0]).all() and (tok[:, 1:] == -1).all()


def test_probs_over_many_blocks_match_reference(ops, gen):
    """Rows of several ``BLOCK_V`` chunks with a ragged end, every cut alone and together."""
    B, V = 8, 3001
    logits = rand(gen, B, V, scale=4.0)
    params = SamplingTensors(
        temperature=torch.tensor([1.0, 0.5, 2.0, 1.0, 0.8, 1.0, 1.2, 0.0]),
        top_k=torch.tensor([0, 1, 7, 300, 0, 2999, 40, 5]),
        top_p=torch.tensor([1.0, 1.0, 1.0, 0.35, 0.95, 0.7, 0.6, 0.5]),
        min_p=torch.tensor([0.0, 0.0, 0.2, 0.0, 0.05, 0.01, 0.0, 0.3]),
    )
    got = ops.probs(dev(logits), SamplingTensors(*dev(*vars(params).values()))).cpu()
    torch.testing.assert_close(got, REF.probs(logits, params), atol=1e-6, rtol=1e-5)
    assert torch.equal(got > 0, REF.probs(logits, params) > 0), "the same tokens survive every cut"


def test_probs_ties_follow_the_reference_order(ops):
    """Equal logits: top-k keeps every tie at the k-th value; a top-p cut inside a tie group keeps the
    group's lowest token ids (stable descending order), wherever they sit in the row."""
    V = 600
    logits = torch.full((3, V), -3.0)
    top = [512, 7, 3, 300, 11]  # five tokens tied at the maximum, ids out of order
    logits[:, top] = 2.0
    logits[:, [40, 41, 590]] = 1.0
    params = SamplingTensors(
        temperature=torch.tensor([1.0, 1.0, 1.0]),
        top_k=torch.tensor([2, 6, 0]),  # k inside the tie group: all five kept; k=6 reaches the 1.0 ties
        top_p=torch.tensor([1.0, 1.0, 0.25]),  # each top token holds ~0.099: the cut falls inside the group
        min_p=torch.tensor([0.0, 0.0, 0.0]),
    )
    got = ops.probs(dev(logits), SamplingTensors(*dev(*vars(params).values()))).cpu()
    ref = REF.probs(logits, params)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    assert (got[0] > 0).sum() == 5 and (got[1] > 0).sum() == 8
    assert (got[2] > 0).nonzero().flatten().tolist() == [3, 7, 11]  # the three lowest ids of the tie
