"""Conformance cases for the sampling ops.

Deterministic ops (penalties, probs, argmax, bitmask, greedy verification) must match the reference
within tolerance. The draws (``sample_keyed``, ``rejection_sample_keyed``) are keyed by seed and position
(:mod:`deepinfer_core.ops.draws`), so they are checked twice: by distribution (many identical rows with
distinct seeds, a chi-square test at p = 1e-4 against the exact distribution, and structural checks: never a
zero-probability token, ``-1`` padding), and token for token against the reference on random rows.
"""

from __future__ import annotations

import math

import torch

from deepinfer_core.ops.sampling import SamplingTensors
from deepinfer_core.testing.opcase import OpCase


def chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, z: float = 3.72) -> tuple[bool, float, float]:
    """Pearson chi-square of ``counts`` against ``probs`` over the tokens with ``p > 0`` (bins with small
    expected counts merged); critical value by the Wilson-Hilferty approximation at the one-sided
    normal quantile ``z`` (3.72: p = 1e-4). Returns ``(ok, statistic, critical value)``."""
    n = float(counts.sum())
    exp = probs.double() * n
    obs = counts.double()
    if bool((obs[exp == 0] > 0).any()):
        return False, math.inf, 0.0
    keep = exp >= 5
    e = torch.cat([exp[keep], exp[~keep & (exp > 0)].sum().reshape(1)])
    o = torch.cat([obs[keep], obs[~keep & (exp > 0)].sum().reshape(1)])
    if float(e[-1]) == 0:
        e, o = e[:-1], o[:-1]
    df = max(len(e) - 1, 1)
    stat = float(((o - e) ** 2 / e).sum())
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat <= crit, stat, crit


def _logits(g: torch.Generator, b: int, v: int) -> torch.Tensor:
    return 3 * torch.randn(b, v, generator=g)


def _params(g: torch.Generator, b: int) -> SamplingTensors:
    t = torch.rand(b, generator=g) + 0.3
    t[0] = 0.0  # one greedy row
    return SamplingTensors(
        temperature=t,
        top_k=torch.randint(-1, 12, (b,), generator=g),
        top_p=torch.where(
            torch.rand(b, generator=g) < 0.5, torch.rand(b, generator=g) * 0.9 + 0.1, torch.ones(b)
        ),
        min_p=torch.where(torch.rand(b, generator=g) < 0.5, torch.rand(b, generator=g) * 0.3, torch.zeros(b)),
    )


def _penalty_inputs(g: torch.Generator):
    b, v = 6, 50
    return (
        _logits(g, b, v),
        torch.rand(b, v, generator=g) < 0.2,
        torch.randint(0, 3, (b, v), generator=g) * (torch.rand(b, v, generator=g) < 0.3),
        torch.rand(b, generator=g) * 4 - 2,
        torch.rand(b, generator=g) * 4 - 2,
        torch.rand(b, generator=g) * 1.5 + 0.5,
    ), {}


def _probs_inputs(g: torch.Generator):
    return (_logits(g, 16, 40), _params(g, 16)), {}


def _probs_unused_cuts(keep: str):
    """Rows that all disable every cut but ``keep``, and say so (``any_*`` False): the platform may skip those
    cuts; the probabilities must not change."""

    def make(g: torch.Generator):
        p = _params(g, 16)
        b = 16
        return (
            _logits(g, b, 40),
            SamplingTensors(
                p.temperature,
                p.top_k if keep == "top_k" else torch.where(torch.rand(b, generator=g) < 0.5, 0, -1),
                p.top_p if keep == "top_p" else torch.ones(b),
                p.min_p if keep == "min_p" else torch.zeros(b),
                any_top_k=keep == "top_k",
                any_top_p=keep == "top_p",
                any_min_p=keep == "min_p",
            ),
        ), {}

    return make


def _argmax_inputs(g: torch.Generator):
    x = torch.randint(0, 4, (32, 70), generator=g).float()  # many ties: the lowest id wins
    return (x,), {}


def _bitmask_inputs(g: torch.Generator):
    v = 100  # not a multiple of 32
    mask = torch.randint(-(2**31), 2**31 - 1, (5, (v + 31) // 32), generator=g, dtype=torch.int64).to(
        torch.int32
    )
    return (_logits(g, 5, v), mask), {}


_SAMPLE_ROWS = 6000


def _keys(g: torch.Generator, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random seeds (63-bit) and positions (some past 2**32) of ``b`` rows."""
    return torch.randint(0, 2**63 - 1, (b,), generator=g), torch.randint(0, 2**34, (b,), generator=g)


def _sample_inputs(g: torch.Generator):
    p = torch.softmax(_logits(g, 1, 12), -1)
    p[0, 3] = 0.0
    p = p / p.sum()
    return (p.expand(_SAMPLE_ROWS, -1).contiguous(), *_keys(g, _SAMPLE_ROWS)), {}


def _compare_sample(actual, expected, inputs) -> None:
    probs = inputs[0][0]
    assert actual.shape == (_SAMPLE_ROWS,) and actual.dtype == torch.int64, "sample: wrong shape or dtype"
    counts = torch.bincount(actual, minlength=probs.shape[1])
    ok, stat, crit = chi_square_ok(counts, probs[0])
    assert ok, (
        f"sample: draws do not follow probs (chi2 {stat:.1f} > {crit:.1f}, or a zero-probability token)"
    )


def _keyed_inputs(g: torch.Generator):
    """Rows of their own (a vocabulary not a multiple of any block, zeros among them): the draws must be the
    core's keyed draw, token for token (the running sum's float64 rounding could only matter where a uniform falls
    within it of a boundary)."""
    p = torch.rand(64, 5001, generator=g) ** 3
    p[:, ::5] = 0.0
    return (p, *_keys(g, 64)), {}


def _rejection_inputs(g: torch.Generator):
    b, k, v = _SAMPLE_ROWS, 2, 6
    target = torch.softmax(_logits(g, 1, v) / 2, -1)[0]
    draft = torch.softmax(_logits(g, 1, v) / 2, -1)[0]
    # drafts drawn from the draft distribution: then the first emitted token follows the target exactly
    draft_ids = torch.multinomial(draft, b * k, replacement=True, generator=g).view(b, k)
    return (
        draft_ids,
        draft.expand(b, k, v).contiguous(),
        target.expand(b, k + 1, v).contiguous(),
        *_keys(g, b),
    ), {}


def _compare_rejection(actual, expected, inputs) -> None:
    draft_ids, _, target, *_ = inputs[0]
    tokens, acc = actual
    k = draft_ids.shape[1]
    assert tokens.shape == (draft_ids.shape[0], k + 1) and acc.shape == (draft_ids.shape[0],)
    for j in range(k + 1):
        emitted = acc >= j
        assert bool((tokens[emitted, j] >= 0).all()) and bool((tokens[~emitted, j] == -1).all()), (
            "bad -1 padding"
        )
        if j < k:
            acc_j = acc > j
            assert bool((tokens[acc_j, j] == draft_ids[acc_j, j]).all()), "accepted tokens must be the drafts"
    ok, stat, crit = chi_square_ok(torch.bincount(tokens[:, 0], minlength=target.shape[2]), target[0, 0])
    assert ok, f"rejection_sample: first token does not follow the target (chi2 {stat:.1f} > {crit:.1f})"


def _rejection_keyed_inputs(one_hot: bool):
    """Rows of their own, drafts drawn from each row's ``q`` (or one-hot drafts): tokens and acceptance counts
    must be the reference's, token for token."""

    def make(g: torch.Generator):
        b, k, v = 48, 3, 40
        draft = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
        ids = torch.multinomial(draft.reshape(-1, v), 1, generator=g).view(b, k)
        bump = torch.cat([torch.nn.functional.one_hot(ids, v).float() * 3, torch.zeros(b, 1, v)], 1)
        target = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2 + bump, -1)  # some drafts accepted
        return (ids, None if one_hot else draft, target, *_keys(g, b)), {}

    return make


def _greedy_verify_inputs(g: torch.Generator):
    b, k, v = 8, 3, 10
    tgt_ids = torch.randint(0, v, (b, k + 1), generator=g)
    target = torch.nn.functional.one_hot(tgt_ids, v).float()
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.7, tgt_ids[:, :k], (tgt_ids[:, :k] + 1) % v)
    return (drafts, None, target, *_keys(g, b)), {}


CASES = [
    OpCase("sampling", "apply_penalties", "vllm_semantics", _penalty_inputs),
    OpCase("sampling", "probs", "temperature_topk_topp_minp_greedy", _probs_inputs, atol=1e-5, rtol=1e-4),
    *(
        OpCase("sampling", "probs", f"only_{keep}", _probs_unused_cuts(keep), atol=1e-5, rtol=1e-4)
        for keep in ("top_k", "top_p", "min_p", "none")
    ),
    OpCase("sampling", "argmax", "ties_lowest_id", _argmax_inputs),
    OpCase("sampling", "apply_bitmask", "ragged_vocab_sign_bit", _bitmask_inputs),
    OpCase("sampling", "sample_keyed", "chi_square", _sample_inputs, compare=_compare_sample),
    OpCase("sampling", "sample_keyed", "the_core_draws", _keyed_inputs),
    OpCase(
        "sampling",
        "rejection_sample_keyed",
        "chi_square_first_token",
        _rejection_inputs,
        compare=_compare_rejection,
    ),
    OpCase("sampling", "rejection_sample_keyed", "the_reference_draws", _rejection_keyed_inputs(False)),
    OpCase(
        "sampling", "rejection_sample_keyed", "the_reference_draws_one_hot", _rejection_keyed_inputs(True)
    ),
    OpCase("sampling", "rejection_sample_keyed", "greedy_one_hot_exact", _greedy_verify_inputs),
]
