"""Sampling ops: Triton penalties and bitmask, torch-on-device probs/sample/rejection, vs the reference."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.sampling import SamplingTensors
from deepinfer_core.plugins.registry import reference_op

from .cuda_sm100_helpers import DEVICE, dev, needs_triton, rand

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


def test_seeded_sample_matches_reference_draws(ops, gen):
    probs = rand(gen, 4, 64).softmax(-1)
    gens = [torch.Generator(DEVICE).manual_seed(s) for s in (1, 2, 3)] + [None]
    got = ops.sample(dev(probs), gens)
    ref_gens = [torch.Generator(DEVICE).manual_seed(s) for s in (1, 2, 3)] + [None]
    ref = REF.sample(dev(probs), ref_gens)
    assert torch.equal(got[:3].cpu(), ref[:3].cpu())
    assert 0 <= int(got[3]) < 64


def test_argmax_ties_go_to_lowest_id(ops):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert ops.argmax(dev(logits)).cpu().tolist() == [1, 0]


def test_rejection_all_accepted_matches_reference(ops, gen):
    """Target = draft: every draft is accepted and the bonus token comes from the last target row."""
    B, k, V = 3, 4, 32
    target = rand(gen, B, k + 1, V).softmax(-1)
    draft_ids = torch.randint(0, V, (B, k), generator=gen)
    draft = target[:, :k].clone()
    g1 = [torch.Generator(DEVICE).manual_seed(7 + b) for b in range(B)]
    g2 = [torch.Generator(DEVICE).manual_seed(7 + b) for b in range(B)]
    tok, n = ops.rejection_sample(*dev(draft_ids, draft, target), g1)
    rtok, rn = REF.rejection_sample(*dev(draft_ids, draft, target), g2)
    assert n.cpu().tolist() == [k] * B == rn.cpu().tolist()
    assert torch.equal(tok.cpu(), rtok.cpu())


def test_rejection_of_impossible_draft_resamples_elsewhere(ops, gen):
    B, k, V = 4, 3, 16
    target = rand(gen, B, k + 1, V).softmax(-1)
    draft_ids = torch.randint(0, V, (B, k), generator=gen)
    target[torch.arange(B), 0, draft_ids[:, 0]] = 0.0  # the first draft can never be accepted
    tok, n = ops.rejection_sample(*dev(draft_ids, None, target), [None] * B)
    assert n.cpu().tolist() == [0] * B
    assert (tok[:, 0].cpu() != draft_ids[:, 0]).all() and (tok[:, 1:] == -1).all()
