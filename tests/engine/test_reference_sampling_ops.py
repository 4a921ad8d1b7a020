"""Reference sampling ops: exact distributions (chi-square), penalties, bitmask, rejection sampling."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.ops.sampling import SamplingTensors
from deepinfer_core.testing.cases_sampling import chi_square_ok

OPS = ReferenceSamplingOps()
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
N = 8000


def _params(t=1.0, k=0, p=1.0, m=0.0) -> SamplingTensors:
    f = lambda v, dt=torch.float32: torch.tensor([v], dtype=dt)  # noqa: E731
    return SamplingTensors(f(t), f(k, torch.int64), f(p), f(m))


def _expected(t=1.0, k=0, p=1.0, m=0.0) -> torch.Tensor:
    """The distribution computed by hand, independently of the op's code path."""
    probs = torch.softmax(LOGITS / t, -1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if k > 0:
        keep[k:] = False  # LOGITS is sorted, no ties
    probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum()
    if p < 1:
        mass, cut = 0.0, len(probs)
        for i, q in enumerate(probs.tolist()):
            if mass >= p:
                cut = i
                break
            mass += q
        probs[cut:] = 0
        probs = probs / probs.sum()
    if m > 0:
        probs = torch.where(probs >= m * probs.max(), probs, 0.0)
        probs = probs / probs.sum()
    return probs


def _draw(params: SamplingTensors, seed: int = 0) -> torch.Tensor:
    probs = OPS.probs(LOGITS[None], params)
    rows = probs.expand(N, -1).contiguous()
    seeds = torch.full((N,), seed, dtype=torch.int64)  # one sequence's N positions
    return torch.bincount(OPS.sample_keyed(rows, seeds, torch.arange(N)), minlength=len(LOGITS))


@pytest.mark.parametrize(
    "kw",
    [
        dict(t=1.0),
        dict(t=0.5),
        dict(t=2.0),
        dict(k=3),
        dict(t=0.7, k=5),
        dict(p=0.8),
        dict(p=0.5, t=1.3),
        dict(m=0.2),
        dict(k=6, p=0.9, m=0.05),
    ],
    ids=lambda kw: ",".join(f"{a}={b}" for a, b in kw.items()),
)
def test_sampling_distribution_matches_the_exact_one(kw):
    exp = _expected(**kw)
    torch.testing.assert_close(OPS.probs(LOGITS[None], _params(**kw))[0], exp, atol=1e-6, rtol=1e-5)
    ok, stat, crit = chi_square_ok(_draw(_params(**kw)), exp)
    assert ok, f"chi2 {stat:.1f} > {crit:.1f}"


def test_chi_square_detects_a_wrong_distribution():
    ok, _, _ = chi_square_ok(_draw(_params(t=1.0)), _expected(t=0.8))
    assert not ok


def test_greedy_is_one_hot_and_ties_go_to_the_lowest_id():
    x = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    assert OPS.argmax(x).tolist() == [1]
    assert OPS.probs(x, _params(t=0.0)).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_p_orders_equal_probabilities_by_token_id():
    x = torch.zeros(1, 4)  # four equal tokens: top_p=0.5 keeps the two lowest ids
    assert OPS.probs(x, _params(p=0.5)).tolist() == [[0.5, 0.5, 0.0, 0.0]]


def test_a_row_draws_the_same_token_whatever_the_rest_of_the_batch():
    probs = torch.softmax(torch.randn(5, 30, generator=torch.Generator().manual_seed(1)), -1)
    alone = OPS.sample_keyed(probs[2:3], torch.tensor([9]), torch.tensor([40]))
    batch = OPS.sample_keyed(probs, torch.tensor([1, 2, 9, 4, 5]), torch.tensor([3, 3, 40, 3, 3]))
    assert int(batch[2]) == int(alone[0])


def test_penalties_follow_vllm_semantics():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    prompt = torch.tensor([[True, True, False, False]])
    counts = torch.tensor([[0, 0, 2, 0]])
    out = OPS.apply_penalties(
        logits, prompt, counts, torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0])
    )
    # rep: 2/2, -2*2, 1/2 (seen in output), 0.5 unseen; then -0.25*count -0.5*present
    torch.testing.assert_close(out, torch.tensor([[1.0, -4.0, 0.5 - 0.5 - 0.5, 0.5]]))


def test_apply_bitmask_allows_exactly_the_set_bits():
    g = torch.Generator().manual_seed(0)
    v = 70
    mask = torch.randint(-(2**31), 2**31 - 1, (3, 3), generator=g, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(3, v, generator=g)
    out = OPS.apply_bitmask(logits, mask)
    for b in range(3):
        for t in range(v):
            allowed = (int(mask[b, t // 32]) >> (t % 32)) & 1
            assert (out[b, t] == logits[b, t]) if allowed else out[b, t] == float("-inf")


def test_rejection_sample_greedy_accepts_the_matching_prefix_then_corrects():
    target_ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    target = torch.nn.functional.one_hot(target_ids, 10).float()
    drafts = torch.tensor([[5, 6, 7], [5, 0, 7]])
    tokens, acc = OPS.rejection_sample_keyed(
        drafts, None, target, torch.tensor([1, 2]), torch.tensor([10, 20])
    )
    assert acc.tolist() == [3, 1]
    assert tokens.tolist() == [[5, 6, 7, 8], [5, 6, -1, -1]]


def test_rejection_sample_output_follows_the_target_distribution():
    g = torch.Generator().manual_seed(3)
    v, n = 5, N
    target = torch.softmax(torch.randn(v, generator=g), -1)
    draft = torch.softmax(torch.randn(v, generator=g), -1)
    ids = torch.multinomial(draft, n, replacement=True, generator=g)[:, None]
    seeds, at = torch.arange(n) * 7919, torch.full((n,), 5)
    tokens, _ = OPS.rejection_sample_keyed(ids, draft.expand(n, 1, v), target.expand(n, 2, v), seeds, at)
    ok, stat, crit = chi_square_ok(torch.bincount(tokens[:, 0], minlength=v), target)
    assert ok, f"chi2 {stat:.1f} > {crit:.1f}"


def test_top_p_of_one_keeps_the_whole_row_in_any_batch():
    """``top_p = 1`` disables the cut: a row's probabilities do not depend on whether another row of its
    batch has ``top_p < 1`` (the running sum reaching 1.0 in float32 must not drop the tail)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5000, generator=g) * 6
    ops = ReferenceSamplingOps()

    def params(top_p):
        return SamplingTensors(
            torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.tensor(top_p), torch.zeros(2)
        )

    alone = ops.probs(logits, params([1.0, 1.0]))
    mixed = ops.probs(logits, params([1.0, 0.5]))
    assert torch.equal(mixed[0] > 0, torch.softmax(logits[0], -1) > 0)  # was: the tail below ~1e-7 dropped
    torch.testing.assert_close(alone[0], mixed[0], rtol=1e-6, atol=0)  # renormalised by a sum of ~1.0
