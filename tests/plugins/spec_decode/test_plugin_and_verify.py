"""The spec_decode plugin registers its proposers through the hook; the verification rules on fixed
distributions (greedy prefix acceptance, one-hot rejection sampling frequencies)."""

from __future__ import annotations

import collections

import pytest
import torch

from deepinfer_core.config import ConfigError
from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.runtime import build_registry
from deepinfer_core.spec_decode import Proposer, build_proposer
from deepinfer_core.spec_decode.verify import verify_greedy, verify_sampled
from deepinfer_spec_decode import plugin
from deepinfer_spec_decode.mtp import MTPProposer
from deepinfer_spec_decode.ngram import NgramProposer

OPS = ReferenceSamplingOps()


class _Model:
    num_mtp_layers = 2


def test_plugin_declares_the_api_and_registers_ngram_mtp_and_dspark_through_the_hook():
    assert plugin.DEEPINFER_PLUGIN_API.startswith("2.1")
    reg = build_registry(allow=["spec_decode"])
    assert {"ngram", "mtp", "dspark"} <= set(reg.proposers)
    assert reg.proposers.owners["ngram"] == reg.proposers.owners["mtp"]
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    p = build_proposer(spec, reg.proposers, _Model(), None)
    assert isinstance(p, NgramProposer) and isinstance(p, Proposer)
    assert (p.num_speculative_tokens, p.min_n, p.max_n) == (3, 2, 5)
    m = build_proposer({"method": "mtp", "num_speculative_tokens": 8}, reg.proposers, _Model(), None)
    assert isinstance(m, MTPProposer) and m.num_modules == 2


def test_no_plugin_means_a_clear_error():
    reg = build_registry(allow=[])
    with pytest.raises(ConfigError, match="deepinfer-spec-decode plugin"):
        build_proposer({"method": "ngram", "num_speculative_tokens": 2}, reg.proposers, _Model(), None)


def test_greedy_accepts_the_matching_prefix_and_adds_the_target_token():
    x = torch.full((4, 6), -1.0)
    for row, tok in enumerate([2, 3, 5, 1]):
        x[row, tok] = 1.0
    xs = torch.cat([x, x, x[:2]])
    got = verify_greedy(OPS, xs, [0, 4, 8], [[2, 3, 4], [2, 3, 5], [0]])
    assert got == [[2, 3, 5], [2, 3, 5, 1], [2]]


def test_one_hot_rejection_sampling_frequencies():
    """Draft 0 is accepted with probability p(0); the emitted first token is distributed as p; a
    second sequence in the same call draws with its own keys only."""
    p = torch.tensor([0.5, 0.3, 0.2])
    probs = p[None].repeat(4, 1)
    n, first, accepted = 6000, collections.Counter(), 0
    for i in range(n):  # one sequence's rounds at successive positions, beside another sequence
        toks, _ = verify_sampled(OPS, probs, [0, 2], [[0], [1]], [0, 1], [2 * i, 2 * i])
        first[toks[0]] += 1
        accepted += len(toks) - 1
    assert abs(accepted / n - 0.5) < 0.03
    for t, pt in enumerate(p.tolist()):
        assert abs(first[t] / n - pt) < 0.03
    # the same keys alone give the same tokens as in the batch, and as plain sampling at those positions
    alone = verify_sampled(OPS, probs[:2], [0], [[0]], [7], [30])
    batched = verify_sampled(OPS, probs, [0, 2], [[0], [2]], [7, 9], [30, 4])
    plain = [
        int(OPS.sample_keyed(probs[:1], torch.tensor([7]), torch.tensor([30 + j])))
        for j in range(len(alone[0]))
    ]
    assert alone[0] == plain
    assert alone[0] == batched[0]


def test_one_hot_verification_draws_every_row_in_one_call():
    """Keyed draws leave no state behind, so every row is drawn at once (one read back a step, not one a depth),
    and the result is the depth-by-depth walk's: each sequence's draws at its positions, up to its first miss."""
    calls = []

    class Counting(type(OPS)):
        def sample_keyed(self, probs, seeds, positions):
            calls.append(len(probs))
            return super().sample_keyed(probs, seeds, positions)

    g = torch.Generator().manual_seed(4)
    probs = torch.softmax(torch.randn(9, 6, generator=g), -1)
    drafts, seeds, at = [[1, 2, 3], [4], [0, 0]], [11, 12, 13], [40, 7, 100]
    got = verify_sampled(Counting(), probs, [0, 4, 6], drafts, seeds, at)
    assert calls == [9]
    for b, (off, d) in enumerate(zip([0, 4, 6], drafts)):
        walk = []
        for j in range(len(d) + 1):
            walk.append(
                int(
                    OPS.sample_keyed(
                        probs[off + j][None], torch.tensor([seeds[b]]), torch.tensor([at[b] + j])
                    )
                )
            )
            if j == len(d) or walk[-1] != d[j]:
                break
        assert got[b] == walk
