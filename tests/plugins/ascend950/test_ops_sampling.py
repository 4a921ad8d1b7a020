"""Contract tests of the ascend950 sampling ops (``npu_top_k_top_p``): the plugin's op code runs on the
CPU against the torch_npu stand-in and is compared with the reference ops on random inputs. This checks
the plugin's plumbing and math against the operator's documented semantics, not the Ascend kernel."""

from __future__ import annotations

import torch

from deepinfer_core.ops.sampling import SamplingTensors


def params(**kw) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.tensor(kw["t"]), top_k=torch.tensor(kw["k"]), top_p=torch.tensor(kw["p"]),
        min_p=torch.tensor(kw["m"]),
    )  # fmt: skip


def test_probs_through_top_k_top_p_match_reference(ascend, ref, all_fused, gen):
    logits = torch.randn(5, 300, generator=gen) * 3
    p = params(
        t=[0.7, 0.0, 1.0, 1.3, 0.9],
        k=[5, -1, 0, 50, 300],
        p=[0.9, 1.0, 0.5, 0.95, 0.2],
        m=[0, 0, 0.1, 0.05, 0],
    )
    got = ascend.sampling.probs(logits, p)
    torch.testing.assert_close(got, ref.sampling.probs(logits, p), atol=1e-6, rtol=1e-5)
    assert all_fused.calls["npu_top_k_top_p"] == 1


def test_rows_without_top_k_and_a_large_vocabulary_fall_back_to_torch(ascend, ref, all_fused, gen):
    """npu_top_k_top_p takes k in [1, 1024]: with V > 1024 a row without top-k cannot be expressed."""
    logits = torch.randn(3, 2000, generator=gen) * 2
    p = params(t=[1.0, 0.8, 0.0], k=[-1, 20, 3], p=[0.9, 0.8, 1.0], m=[0.0, 0.0, 0.0])
    torch.testing.assert_close(
        ascend.sampling.probs(logits, p), ref.sampling.probs(logits, p), atol=1e-6, rtol=1e-5
    )
    assert all_fused.calls["npu_top_k_top_p"] == 0


def test_sample_argmax_penalties_and_bitmask_match_reference(ascend, ref, gen):
    logits = torch.randn(3, 40, generator=gen)
    probs = torch.softmax(logits, -1)
    seeds, at = torch.tensor([1, 2, 3]), torch.tensor([5, 5, 9])
    draws = [ascend.sampling.sample_keyed(probs, seeds, at) for _ in range(2)]
    want = ref.sampling.sample_keyed(probs, seeds, at)
    assert torch.equal(draws[0], want) and torch.equal(draws[1], want)
    assert torch.equal(ascend.sampling.argmax(logits), ref.sampling.argmax(logits))
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 2), generator=gen, dtype=torch.int64).to(torch.int32)
    assert torch.equal(
        ascend.sampling.apply_bitmask(logits, bitmask), ref.sampling.apply_bitmask(logits, bitmask)
    )
    mask, counts = torch.rand(3, 40, generator=gen) < 0.2, torch.randint(0, 3, (3, 40), generator=gen)
    pen = (torch.tensor([0.1, 0.0, 0.5]), torch.tensor([0.2, 0.3, 0.0]), torch.tensor([1.2, 1.0, 0.8]))
    torch.testing.assert_close(
        ascend.sampling.apply_penalties(logits, mask, counts, *pen),
        ref.sampling.apply_penalties(logits, mask, counts, *pen),
    )
