"""The ``sampling.probs[only_*]`` cases are valid: their rows disable every cut but one and say so, the reference
passes them, and a platform that skips every cut (as if all flags were False) fails each case whose rows use one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.testing import cases_sampling, check_case
from deepinfer_core.testing.kit import reference_backends

CASES = {c.name: c for c in cases_sampling.CASES if c.op == "probs" and c.name.startswith("only_")}
REFERENCE = reference_backends()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_rows_match_their_flags_and_the_reference_passes(name):
    (_, p), _ = CASES[name].make_inputs(torch.Generator().manual_seed(4))
    used = (bool((p.top_k > 0).any()), bool((p.top_p < 1).any()), bool((p.min_p > 0).any()))
    assert used == (p.any_top_k, p.any_top_p, p.any_min_p)
    assert sum(used) == (0 if name == "only_none" else 1)
    check_case(REFERENCE, CASES[name])


class SkipsEveryCut(ReferenceSamplingOps):
    def probs(self, logits, params):
        flat = dataclasses.replace(
            params,
            top_k=torch.zeros_like(params.top_k),
            top_p=torch.ones_like(params.top_p),
            min_p=torch.zeros_like(params.min_p),
        )
        return super().probs(logits, flat)


@pytest.mark.parametrize("name", ["only_top_k", "only_top_p", "only_min_p"])
def test_skipping_a_cut_a_row_uses_fails(name):
    with pytest.raises(AssertionError):
        check_case(dataclasses.replace(REFERENCE, sampling=SkipsEveryCut()), CASES[name])
    check_case(dataclasses.replace(REFERENCE, sampling=SkipsEveryCut()), CASES["only_none"])
