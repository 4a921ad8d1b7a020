"""Rejection sampling with a proposer's draft distribution ``q`` is lossless, at the verifier's level.

The target is a Markov chain ``P[prev]`` over a 4-token vocabulary and the drafts a different chain
``Q[prev]``; each round drafts 3 tokens from ``Q`` and verifies them with the engine's
:func:`verify_with_probs` on the reference ``rejection_sample_keyed`` until 3 tokens are emitted. Their joint
distribution must be ``P[0, a] P[a, b] P[b, c]`` (chi-square goodness of fit, 63 degrees of freedom, at
p = 1e-3), and the first draft must be accepted with probability ``sum min(p, q)``.

What a broken verifier does (computed exactly by :func:`_exact`, which also gives each test's power):

- on rejection, drawing from ``p`` instead of ``normalize(max(0, p - q))``, or from ``p`` without the draft
  (``q`` ignored in the residual only): the emitted tokens are biased, the chi-square test fails;
- ignoring ``q`` altogether (treating drafts as one-hot: accept ``x`` with ``p(x)``, else draw from ``p``
  without ``x``) is *still lossless*: conditioned on any draft value the emitted token is distributed as
  ``p``, however the draft was chosen. So it passes the distribution test, as the test asserts, and what
  gives it away is acceptance: ``sum p q`` (0.17 here) instead of ``sum min(p, q)`` (0.5).
"""

from __future__ import annotations

import collections
import functools
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, chi2, ncx2

from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps, _accept_uniform, _draw
from deepinfer_core.spec_decode.verify import verify_with_probs

V, K, M = 4, 3, 3  # vocabulary, drafts per round, tokens compared
P = np.array([[0.55, 0.25, 0.15, 0.05], [0.1, 0.5, 0.3, 0.1], [0.25] * 4, [0.05, 0.15, 0.3, 0.5]])
Q = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.1, 0.4], [0.7, 0.1, 0.1, 0.1], [0.25] * 4])
N = 1200  # samples; see test_the_sample_count_gives_the_test_power
ALPHA = 1e-3


class _ResidualFromP(ReferenceSamplingOps):
    """Accepts with min(1, p/q), but on rejection draws from p (the classic bug)."""

    def rejection_sample_keyed(self, draft_ids, draft_probs, target_probs, seeds, positions):
        return _rule_ops(draft_ids, draft_probs, target_probs, seeds, positions, lambda p, q, x: p)


class _ResidualWithoutDraft(ReferenceSamplingOps):
    """Accepts with min(1, p/q), but on rejection draws from p without the draft (q ignored there)."""

    def rejection_sample_keyed(self, draft_ids, draft_probs, target_probs, seeds, positions):
        def resid(p, q, x):
            r = p.clone()
            r[x] = 0
            return r / r.sum()

        return _rule_ops(draft_ids, draft_probs, target_probs, seeds, positions, resid)


class _IgnoresQ(ReferenceSamplingOps):
    """Treats drafts as one-hot: the reference's own rule with ``draft_probs=None``."""

    def rejection_sample_keyed(self, draft_ids, draft_probs, target_probs, seeds, positions):
        return super().rejection_sample_keyed(draft_ids, None, target_probs, seeds, positions)


def _rule_ops(draft_ids, draft_probs, target_probs, seeds, positions, residual):
    b, k = draft_ids.shape
    tokens = torch.full((b, k + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(b, dtype=torch.int64)
    for r in range(b):
        seed, pos, out = int(seeds[r]), int(positions[r]), []
        for j in range(k):
            x, p, q = int(draft_ids[r, j]), target_probs[r, j], draft_probs[r, j]
            if _accept_uniform(seed, pos + j) * q[x] < p[x]:
                out.append(x)
                continue
            out.append(_draw(residual(p, q, x), seed, pos + j))
            break
        else:
            out.append(_draw(target_probs[r, k], seed, pos + k))
        tokens[r, : len(out)] = torch.tensor(out)
        accepted[r] = len(out) - 1
    return tokens, accepted


def _run(ops) -> tuple[collections.Counter, int]:
    """``N`` sequences from context token 0: rounds of ``K`` drafts from ``Q`` until ``M`` tokens are out.
    Returns the counts of the first ``M`` tokens and how many first drafts of the first round were
    accepted."""
    pt, qt = torch.tensor(P, dtype=torch.float32), torch.tensor(Q, dtype=torch.float32)
    draft_gen = torch.Generator().manual_seed(1)
    out: list[list[int]] = [[] for _ in range(N)]
    last = [0] * N
    first_accepted = -1
    while live := [i for i in range(N) if len(out[i]) < M]:
        ctx = torch.tensor([last[i] for i in live])
        drafts = []
        for _ in range(K):  # x_{j+1} ~ Q[x_j]
            drafts.append(
                torch.multinomial(qt[ctx if not drafts else drafts[-1]], 1, generator=draft_gen)[:, 0]
            )
        d = torch.stack(drafts, 1)  # [B, K]
        chain = torch.cat([ctx[:, None], d], 1)  # contexts of the K + 1 target rows
        probs = pt[chain].reshape(-1, V)
        q = [qt[chain[b, :K]] for b in range(len(live))]
        offsets = [b * (K + 1) for b in range(len(live))]
        seeds, at = (
            [10_000 + i for i in live],
            [len(out[i]) for i in live],
        )  # keyed at the next token's position
        got = verify_with_probs(ops, probs, offsets, d.tolist(), q, seeds, at)
        if first_accepted < 0:
            first_accepted = sum(len(t) > 1 for t in got)
        for i, toks in zip(live, got):
            out[i].extend(toks)
            last[i] = out[i][-1]
    return collections.Counter(tuple(o[:M]) for o in out), first_accepted


def _pvalue(counts: collections.Counter) -> float:
    truth = _truth().ravel() * N
    obs = np.array([counts[c] for c in itertools.product(range(V), repeat=M)])
    return float(chi2.sf(((obs - truth) ** 2 / truth).sum(), V**M - 1))


def _truth() -> np.ndarray:
    return np.einsum("a,ab,bc->abc", P[0], P, P)


# --- exact distributions of the emitted tokens under a verification rule (for the power) ---


def _correct(p, q, x):
    r = np.maximum(p - q, 0)
    return min(1.0, p[x] / q[x]), r / r.sum()


def _from_p(p, q, x):
    return min(1.0, p[x] / q[x]), p


def _without_draft(p, q, x):
    r = p.copy()
    r[x] = 0
    return min(1.0, p[x] / q[x]), r / r.sum()


def _one_hot(p, q, x):
    r = p.copy()
    r[x] = 0
    return p[x], r / r.sum()


def _exact(rule) -> np.ndarray:
    """Distribution of the first ``M`` tokens from context 0: ``f(c, m)`` is that of the next ``m`` tokens
    after context ``c``, one round's outcomes composed with ``f`` of what is left."""

    @functools.cache
    def f(c: int, m: int) -> np.ndarray:
        out = np.zeros((V,) * m)
        for xs in itertools.product(range(V), repeat=K):
            w = np.prod([Q[a, b] for a, b in zip((c,) + xs, xs)])
            rows = (c,) + xs
            for j in range(K + 1):  # j drafts accepted, then one token drawn
                if j == K:
                    emit_w = P[rows[K]]
                else:
                    a, r = rule(P[rows[j]], Q[rows[j]], xs[j])
                    emit_w = (1 - a) * r
                for t in range(V):
                    _add(out, list(xs[:j]) + [t], w * emit_w[t], m, f)
                if j < K:
                    w = w * rule(P[rows[j]], Q[rows[j]], xs[j])[0]
        return out

    return f(0, M)


def _add(out: np.ndarray, emitted: list[int], w: float, m: int, f) -> None:
    if w == 0:
        return
    if len(emitted) >= m:
        out[tuple(emitted[:m])] += w
        return
    out[tuple(emitted)] += w * f(emitted[-1], m - len(emitted))


def test_the_sample_count_gives_the_test_power():
    """With ``N`` samples, each broken verifier fails the chi-square test at ``ALPHA`` with probability
    > 1 - 1e-9 (non-central chi-square of the exact biased distribution); the correct rule and the
    one-hot rule are exactly lossless."""
    truth, df = _truth(), V**M - 1
    crit = chi2.isf(ALPHA, df)
    for rule in (_correct, _one_hot):
        np.testing.assert_allclose(_exact(rule), truth, atol=1e-12)
    for rule in (_from_p, _without_draft):
        lam = N * (((_exact(rule) - truth) ** 2) / truth).sum()
        assert ncx2.sf(crit, df, lam) > 1 - 1e-9, rule.__name__


@pytest.fixture(scope="module")
def correct():
    return _run(ReferenceSamplingOps())


def test_sampled_drafts_verified_with_q_emit_the_target_distribution(correct):
    counts, first = correct
    assert _pvalue(counts) > ALPHA
    # first draft accepted with probability sum min(p, q) = 0.5
    assert binomtest(first, N, float(np.minimum(P[0], Q[0]).sum())).pvalue > ALPHA


@pytest.mark.parametrize("ops", [_ResidualFromP(), _ResidualWithoutDraft()], ids=["from_p", "without_draft"])
def test_a_verifier_with_the_wrong_residual_fails_the_distribution_test(ops):
    assert _pvalue(_run(ops)[0]) < ALPHA


def test_a_verifier_that_ignores_q_stays_lossless_but_accepts_less():
    counts, first = _run(_IgnoresQ())
    assert _pvalue(counts) > ALPHA  # lossless: see the module docstring
    target = float(np.minimum(P[0], Q[0]).sum())
    assert binomtest(first, N, target).pvalue < ALPHA
    assert binomtest(first, N, float((P[0] * Q[0]).sum())).pvalue > ALPHA
