"""Keyed draws (``deepinfer_core.ops.draws``): the torch code against a scalar Python transcription of the
module's written definition, and the uniforms' and draws' distributions against the exact ones."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops import draws
from deepinfer_core.testing.cases_sampling import chi_square_ok

MASK = 0xFFFF_FFFF


def _mix(x: int) -> int:  # lowbias32, as the module docstring writes it, on Python ints
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK
    return x ^ (x >> 16)


def _key(seed: int, pos: int, stream: int) -> int:
    k = _mix((seed & MASK) ^ 0x9E3779B9)
    k = _mix(k ^ (seed >> 32))
    k = _mix(k ^ (pos & MASK))
    return _mix(k ^ (((pos >> 32) + stream * 0x632BE5AB) & MASK))


def _uniform(seed: int, pos: int, stream: int) -> float:
    return (_key(seed, pos, stream) + 0.5) * 2.0**-32


def _inverse(w: list[float], u: float) -> int:
    """The draw as the module docstring writes it, with Python floats (float64) and a sequential running sum."""
    c, total = [], 0.0
    for x in w:
        total += x
        c.append(total)
    x = u * total
    t = sum(ci <= x for ci in c)
    last = max((i for i, x in enumerate(w) if x > 0), default=0)
    return min(t, last)


def test_mix_matches_the_transcription_and_does_not_collide():
    """Including the int64 path's edge (values near 2**32, where a plain int64 product would overflow), and
    no two of 200k inputs mapped together (the finaliser is a bijection of 32-bit values)."""
    xs = [0, 1, 2, 0x7FFFFFFF, 0x80000000, MASK - 1, MASK]
    assert [int(v) for v in draws.mix(torch.tensor(xs))] == [_mix(x) for x in xs]
    many = draws.mix(torch.arange(0, 2**32, 2**32 // 200_000, dtype=torch.int64))
    assert many.unique().numel() == many.numel() and int(many.max()) <= MASK and int(many.min()) >= 0


@pytest.mark.parametrize("stream", [draws.SAMPLE, draws.ACCEPT])
def test_uniforms_are_the_written_definition(stream):
    g = torch.Generator().manual_seed(3)
    seeds = torch.cat([torch.tensor([0, 1, 2**63 - 1]), torch.randint(0, 2**63 - 1, (200,), generator=g)])
    pos = torch.cat([torch.tensor([0, 2**32 + 5, 2**40]), torch.randint(0, 2**33, (200,), generator=g)])
    got = draws.uniforms(seeds, pos, stream)
    assert got.dtype == torch.float64
    assert got.tolist() == [_uniform(int(s), int(p), stream) for s, p in zip(seeds, pos)]  # exact
    assert float(got.min()) > 0 and float(got.max()) < 1


def test_streams_positions_and_seeds_give_different_uniforms():
    s, p = torch.tensor([7, 7, 8, 7]), torch.tensor([11, 12, 11, 11])
    u = draws.uniforms(s, p, draws.SAMPLE).tolist() + draws.uniforms(s[:1], p[:1], draws.ACCEPT).tolist()
    assert len({u[0], u[1], u[2], u[4]}) == 4 and u[0] == u[3]  # and the same key is the same uniform


def test_uniforms_are_uniform_and_successive_positions_uncorrelated():
    """One sequence's 200k positions over 256 bins (chi-square at p = 1e-4); lag-1 correlation near 0."""
    n = 200_000
    u = draws.uniforms(torch.full((n,), 12345), torch.arange(n), draws.SAMPLE)
    counts = torch.bincount((u * 256).long(), minlength=256)
    ok, stat, crit = chi_square_ok(counts, torch.full((256,), 1 / 256, dtype=torch.float64))
    assert ok, (stat, crit)
    c = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]
    assert abs(float(c)) < 4 / n**0.5


def test_draw_is_the_written_definition():
    g = torch.Generator().manual_seed(1)
    w = torch.rand(40, 300, generator=g) ** 4
    w[:, ::4] = 0.0
    w[3] = 0.0  # a row of zeros
    w[5, 299] = 0.0  # trailing zeros
    w[5, 250:] = 0.0
    s, at = torch.randint(0, 2**62, (40,), generator=g), torch.randint(0, 2**35, (40,), generator=g)
    want = [
        _inverse(w[b].double().tolist(), _uniform(int(s[b]), int(at[b]), draws.SAMPLE)) for b in range(40)
    ]
    assert draws.draw(w, s, at).tolist() == want
    assert want[3] == 0


def test_draw_follows_the_distribution_and_skips_zeros():
    p = torch.tensor([0.5, 0.0, 0.2, 0.2, 0.1])
    n = 20000
    tokens = draws.draw(p.expand(n, -1), torch.full((n,), 99), torch.arange(n))  # one sequence, n positions
    counts = torch.bincount(tokens, minlength=5)
    assert int(counts[1]) == 0
    ok, stat, crit = chi_square_ok(counts, p)
    assert ok, (stat, crit)


def test_draw_rows_do_not_depend_on_the_batch_or_the_scale():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(6, 777, generator=g)
    s, at = torch.randint(0, 2**62, (6,), generator=g), torch.randint(0, 10**6, (6,), generator=g)
    whole = draws.draw(p, s, at)
    assert torch.equal(
        whole, torch.cat([draws.draw(p[b : b + 1], s[b : b + 1], at[b : b + 1]) for b in range(6)])
    )
    assert torch.equal(whole, draws.draw(p * 4, s, at))  # a power of two: the same running sums, scaled


def test_a_plugin_written_for_generators_still_instantiates_and_draws_keyed():
    """A 2.7 platform's sampling ops: ``sample`` / ``rejection_sample`` with generators, which the engine no longer
    calls. The class still instantiates (they left the abstract base), and its keyed draws are the base class's."""
    from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps

    class Old(ReferenceSamplingOps):
        def sample(self, probs, generators):
            raise AssertionError("the engine must not call sample(probs, generators)")

        def rejection_sample(self, draft_ids, draft_probs, target_probs, generators):
            raise AssertionError("the engine must not call rejection_sample(..., generators)")

    p = torch.rand(4, 50, generator=torch.Generator().manual_seed(2))
    s, at = torch.tensor([1, 2, 3, 4]), torch.tensor([9, 9, 9, 9])
    assert torch.equal(Old().sample_keyed(p, s, at), draws.draw(p, s, at))
