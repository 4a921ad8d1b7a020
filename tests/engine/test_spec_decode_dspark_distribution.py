"""Sampling with DSpark leaves the output distribution unchanged (issue #25), on the tiny V4.1 checkpoint
``flash_mini`` (random DSpark weights, vocabulary 384), float32, unquantized KV.

One request samples 32 sequences of 13 tokens at temperature 2, with one DSpark draft a round (the head's
and the target's distributions then overlap: about half the drafts are accepted). Every token after the
first, drafted or not, must be a draw from the target's ``p`` given its prefix: the engine's sampling
distribution over the logits that ``tests/models/deepseek_v41/test_engine_vs_reference.py`` checks against
DeepSeek's reference, recomputed here teacher-forced on fresh pools. Two chi-square tests of that on the 384
tokens (see :func:`_pvalues`) must not reject at 1e-3. The same tests reject a verifier that ignores ``q``
on rejection (draws from ``p`` instead of the residual) and a DSpark that reports ``q`` but drafts its
argmax. Measured (seeded, so deterministic) p-values, omnibus / where ``q > p``: DSpark 0.85 / 0.70
(acceptance 51%); residual ignoring ``q`` 1.7e-3 / 3.4e-7; argmax drafts 7.0e-15 / 1.6e-8.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chi2

import deepinfer_core.spec_decode.verify as verify
from deepinfer_core import SamplingParams
from deepinfer_core.engine.sampler import sampling_tensors
from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.testing.kv_harness import PagedKVHarness
from deepinfer_spec_decode.dspark import DSparkProposer

from .test_spec_decode_dspark import VOCAB, _engine

TEMPERATURE = 2.0
REQUESTS, N, TOKENS = 1, 32, 13  # 384 tokens after the first
BINS = 10
PROMPT = [random.Random(11).randrange(2, VOCAB) for _ in range(17)]


def _params(i: int) -> SamplingParams:
    return SamplingParams(max_tokens=TOKENS, temperature=TEMPERATURE, seed=100 + i, n=N, ignore_eos=True)


def _sample() -> tuple[list[list[int]], dict, object, dict]:
    """The tokens of every sample, the run's stats, its model, and each draft's ``q`` by its context."""
    llm = _engine({"method": "dspark", "num_speculative_tokens": 1}, max_num_seqs=256, max_n=N)
    qs: dict[tuple[int, ...], torch.Tensor] = {}
    propose = llm.engine.proposer.propose

    def spy(seqs, limits):
        drafts = propose(seqs, limits)
        qs.update((tuple(s.token_ids), d.probs[0]) for s, d in zip(seqs, drafts) if d)
        return drafts

    llm.engine.proposer.propose = spy
    outs = llm.generate(
        [{"prompt_token_ids": PROMPT}] * REQUESTS, [_params(i) for i in range(REQUESTS)], use_tqdm=False
    )
    samples = [list(c.token_ids) for o in outs for c in o.outputs]
    assert all(len(t) == TOKENS for t in samples)
    return samples, llm.get_stats(), llm.engine.model, qs


def _target_probs(model, samples: list[list[int]]) -> torch.Tensor:
    """``[samples, TOKENS - 1, V]``: the request's sampling distribution of each token after the first, given
    the prompt and the tokens before it, teacher-forced on fresh pools in one batch."""
    h = PagedKVHarness(model.cache_specs(), num_blocks=16 * len(samples) + 16)
    seqs = {h.add_sequence(): PROMPT + t[:-1] for t in samples}
    with torch.inference_mode():
        batch = h.step(seqs, logits="all")
        rows = model.forward(batch, h.pools).view(len(samples), len(PROMPT) + TOKENS - 1, -1)
        logits = model.compute_logits(rows[:, len(PROMPT) :].reshape(-1, rows.shape[-1])).float()
    tensors = sampling_tensors([SimpleNamespace(params=_params(0))] * logits.shape[0])
    return ReferenceSamplingOps().probs(logits, tensors).view(len(samples), TOKENS - 1, -1)


def _pvalues(samples: list[list[int]], model, qs: dict) -> tuple[float, float]:
    """Each token after the first (drafted or not) must be a draw from ``p`` given its prefix. Two
    chi-square tests of that, each at the 1e-3 level:

    - *omnibus*: randomized PITs (tokens ordered by decreasing ``p``, or by decreasing ``q/p`` where DSpark
      drafted: any order its prefix decides will do) are independent uniforms; ten equal bins, 9 dof;
    - *where q > p* (draft positions): the count of tokens in ``{y: q(y) > p(y)}`` against its expectation
      under ``p``, one dof (sum of Bernoulli variances), where a verifier that mishandles ``q`` moves mass.
    """
    probs = _target_probs(model, samples)
    g = torch.Generator().manual_seed(5)
    u, hits, expect = [], [], []
    for toks, ps in zip(samples, probs):
        for i, (t, p) in enumerate(zip(toks[1:], ps), start=1):
            q = qs.get(tuple(PROMPT + toks[:i]))
            key = p if q is None else torch.where(p > 0, q / p, -1.0)
            order = torch.argsort(key, descending=True, stable=True)
            rank = int((order == t).nonzero())
            u.append(float(p[order[:rank]].sum()) + float(torch.rand((), generator=g)) * float(p[t]))
            if q is not None:
                hits.append(float(q[t] > p[t]))
                expect.append(float(p[q > p].sum()))
    counts = torch.histc(torch.tensor(u), bins=BINS, min=0.0, max=1.0)
    omnibus = float(((counts - len(u) / BINS) ** 2 / (len(u) / BINS)).sum())
    e = torch.tensor(expect)
    where = float((sum(hits) - e.sum()) ** 2 / (e * (1 - e)).sum())
    return float(chi2.sf(omnibus, BINS - 1)), float(chi2.sf(where, 1))


def test_token_after_a_dspark_round_is_distributed_as_plain_sampling():
    samples, stats, model, qs = _sample()
    # DSpark drafted for every sample, and both outcomes happened often
    assert stats["spec_num_draft_tokens"] >= REQUESTS * N * 4
    rate = stats["spec_num_accepted_tokens"] / stats["spec_num_draft_tokens"]
    assert 0.2 < rate < 0.8, rate
    pvalues = _pvalues(samples, model, qs)
    print("DSpark sampling: acceptance", rate, "p-values (omnibus, where q > p)", pvalues)
    assert min(pvalues) > 1e-3


def _residual_ignores_q(ops, probs, offsets, drafts, draft_probs, seeds, positions):
    """Accepts draft ``x`` with probability ``min(1, p(x)/q(x))`` but on rejection draws from ``p``."""
    out = []
    for off, d, q, seed, pos in zip(offsets, drafts, draft_probs, seeds, positions):
        g = torch.Generator().manual_seed(seed ^ pos)
        toks = []
        for j in range(len(d) + 1):
            p = probs[off + j]
            if j < len(d) and float(torch.rand((), generator=g)) < min(1.0, float(p[d[j]] / q[j, d[j]])):
                toks.append(d[j])
                continue
            toks.append(int(ops.sample_keyed(p[None], torch.tensor([seed]), torch.tensor([pos + j]))[0]))
            break
        out.append(toks)
    return out


class _ArgmaxDraws:
    """The proposer's context, except that a draft is ``q``'s most likely token instead of a draw from it."""

    def __init__(self, ctx):
        self._ctx = ctx

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def draw(self, who, probs):
        return probs.argmax(-1).tolist()


@pytest.mark.parametrize("bug", ["residual_ignores_q", "drafts_the_argmax"])
def test_the_same_test_fails_a_verifier_that_ignores_q_and_a_draft_not_drawn_from_q(monkeypatch, bug):
    if bug == "residual_ignores_q":
        monkeypatch.setattr(verify, "verify_with_probs", _residual_ignores_q)
    else:
        original = DSparkProposer.bind

        monkeypatch.setattr(DSparkProposer, "bind", lambda self, ctx: original(self, _ArgmaxDraws(ctx)))
    samples, stats, model, qs = _sample()
    assert stats["spec_num_accepted_tokens"] > 0
    pvalues = _pvalues(samples, model, qs)
    print(
        bug,
        "acceptance",
        stats["spec_num_accepted_tokens"] / stats["spec_num_draft_tokens"],
        "p-values",
        pvalues,
    )
    assert min(pvalues) < 1e-3
