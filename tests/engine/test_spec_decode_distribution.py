"""Speculative sampling leaves the output distribution unchanged: on a toy model with an 8-token
vocabulary, the joint distribution of the two tokens verified in one draft round matches plain sampling
(two-sample chi-square, disjoint fixed seeds), for n-gram drafts (one-hot q) and for drafts sampled from a
proposer's q (a :class:`Draft`), and a verifier with the classic bug (on rejection, resample from ``p``
instead of the residual) fails the same test. The verifier on q, its broken variants and the tests' power
are in ``test_spec_decode_rejection.py``."""

from __future__ import annotations

import collections

import pytest
import torch
from scipy.stats import chi2

import deepinfer_core.spec_decode.verify as verify
from deepinfer_core import SamplingParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.draft_rounds import _draft_probs
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.spec_decode import Draft, Proposer
from deepinfer_spec_decode.ngram import NgramProposer, make_ngram

from .conftest import toy_backends
from .toy_model import ToyHybridLM

VOCAB = 8
PROMPT = {"prompt_token_ids": [0, 1, 2, 3, 4, 5, 6, 7] * 2 + [0]}  # every token recurs: always drafts
SAMPLES = 2400
TEMPERATURE = 3.0  # the toy logits are peaked; spread them over many cells


def _llm(spec: bool) -> LLM:
    config = load_config(
        environ={},
        kv_cache_memory_bytes=32 << 20,
        max_model_len=64,
        max_num_seqs=256,
        max_num_batched_tokens=4096,
        max_n=200,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
        if spec
        else None,
    )
    model = ToyHybridLM(vocab_size=VOCAB, max_pos=64, seed=2)
    return LLM.from_engine(LLMEngine(config, model, toy_backends(), None, proposers={"ngram": make_ngram}))


def _pairs(spec: bool, seed0: int) -> tuple[collections.Counter, dict]:
    """Tokens 2 and 3 of ``SAMPLES`` samples: after token 1 the round drafts exactly those two."""
    llm = _llm(spec)
    params = [
        SamplingParams(max_tokens=4, temperature=TEMPERATURE, seed=seed0 + i, n=200, ignore_eos=True)
        for i in range(SAMPLES // 200)
    ]
    outs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    pairs = collections.Counter(tuple(c.token_ids[1:3]) for o in outs for c in o.outputs)
    return pairs, llm.get_stats()


def _chi2_pvalue(a: collections.Counter, b: collections.Counter) -> float:
    cells = sorted(set(a) | set(b))
    stat = sum((a[c] - b[c]) ** 2 / (a[c] + b[c]) for c in cells)
    return float(chi2.sf(stat, len(cells) - 1))


@pytest.fixture(scope="module")
def plain():
    return _pairs(False, seed0=10_000)[0]


def test_two_token_distribution_with_speculation_matches_plain_sampling(plain):
    spec, stats = _pairs(True, seed0=0)
    # the rounds do verify drafts, and both outcomes happen
    assert stats["spec_num_draft_tokens"] >= SAMPLES
    assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"]
    assert _chi2_pvalue(spec, plain) > 1e-3


def test_a_biased_verifier_fails_the_same_test(plain, monkeypatch):
    def biased(ops, probs, offsets, drafts, seeds, positions):
        out = []
        for off, d, seed, pos in zip(offsets, drafts, seeds, positions):
            g = torch.Generator().manual_seed(seed ^ pos)
            toks = []
            for j in range(len(d) + 1):
                p = probs[off + j]
                if j < len(d) and float(torch.rand((), generator=g)) < float(p[d[j]]):
                    toks.append(d[j])
                    continue
                toks.append(
                    int(ops.sample_keyed(p[None], torch.tensor([seed]), torch.tensor([pos + j]))[0])
                )  # bug: not the residual
                break
            out.append(toks)
        return out

    monkeypatch.setattr(verify, "verify_sampled", biased)
    spec, _ = _pairs(True, seed0=0)
    assert _chi2_pvalue(spec, plain) < 1e-3


class _FixedQProposer(Proposer):
    """Drafts 2 tokens drawn from a fixed distribution over the toy vocabulary (context-free), through the
    context's draft generators, and returns that distribution as each draft's ``q``."""

    num_speculative_tokens = 2
    Q = torch.tensor([0.3, 0.05, 0.05, 0.1, 0.2, 0.1, 0.15, 0.05])

    def bind(self, ctx) -> None:
        self.ctx = ctx

    def propose(self, seqs, limits):
        out = []
        for s, k in zip(seqs, limits):
            q = self.Q[None].repeat(k, 1)
            out.append(Draft(self.ctx.draw([s] * k, q), q))
        return out


def _llm_q() -> LLM:
    config = load_config(
        environ={},
        kv_cache_memory_bytes=32 << 20,
        max_model_len=64,
        max_num_seqs=256,
        max_num_batched_tokens=4096,
        max_n=200,
        speculative_config={"method": "fixed_q", "num_speculative_tokens": 2},
    )
    model = ToyHybridLM(vocab_size=VOCAB, max_pos=64, seed=2)
    engine = LLMEngine(
        config, model, toy_backends(), None, proposers={"fixed_q": lambda m, s, c: _FixedQProposer()}
    )
    return LLM.from_engine(engine)


def _pairs_q(seed0: int) -> tuple[collections.Counter, dict]:
    llm = _llm_q()
    params = [
        SamplingParams(max_tokens=4, temperature=TEMPERATURE, seed=seed0 + i, n=200, ignore_eos=True)
        for i in range(SAMPLES // 200)
    ]
    outs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    return collections.Counter(tuple(c.token_ids[1:3]) for o in outs for c in o.outputs), llm.get_stats()


def test_drafts_sampled_from_q_end_to_end_match_plain_sampling(plain):
    """Drafts drawn from the proposer's q go through the draft round, the scheduler and the sampler's
    rejection sampling on q: tokens 2 and 3 (the first round's two drafts) are distributed as in plain
    sampling."""
    spec, stats = _pairs_q(seed0=0)
    assert stats["spec_num_draft_tokens"] >= SAMPLES
    assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"]
    assert _chi2_pvalue(spec, plain) > 1e-3


class _OneHotDrafts(NgramProposer):
    """n-gram drafts handed over as :class:`Draft` objects with an explicit one-hot ``q``."""

    def propose(self, seqs, limits):
        out = []
        for d in super().propose(seqs, limits):
            q = torch.zeros(len(d), VOCAB)
            q[torch.arange(len(d)), torch.tensor(d, dtype=torch.int64)] = 1.0
            out.append(Draft(d, q) if d else d)
        return out


def test_a_one_hot_q_gives_exactly_the_tokens_of_list_drafts():
    """A Draft whose q is one-hot is the deterministic-draft case: seeded output identical to the same drafts
    given as a plain list (and so to plain sampling)."""
    params = SamplingParams(max_tokens=6, temperature=TEMPERATURE, seed=5, n=40, ignore_eos=True)
    lists = _llm(True).generate([PROMPT], params, use_tqdm=False)[0]
    engine = _llm(True).engine
    engine.proposer = _OneHotDrafts(2, 1, 3)
    llm = LLM.from_engine(engine)
    drafts = llm.generate([PROMPT], params, use_tqdm=False)[0]
    assert [c.token_ids for c in drafts.outputs] == [c.token_ids for c in lists.outputs]
    assert llm.get_stats()["spec_num_draft_tokens"] > 0


def test_draft_probs_that_cannot_have_produced_the_drafts_are_refused():
    q = torch.full((2, VOCAB), 1 / VOCAB)
    assert torch.equal(_draft_probs(Draft([1, 2], q), 2), q)  # q kept as given
    assert _draft_probs(Draft([1, 2], q), 1).shape == (1, VOCAB)  # cut to the drafts kept
    with pytest.raises(ValueError, match=r"\[2, V\]"):
        _draft_probs(Draft([1, 2], q[:1]), 2)
    zero = q.clone()
    zero[1, 2] = 0.0
    with pytest.raises(ValueError, match="probability 0"):
        _draft_probs(Draft([1, 2], zero), 2)
