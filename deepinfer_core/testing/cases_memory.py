"""Conformance cases for the memory ops."""

from __future__ import annotations

import torch

from deepinfer_core.testing.opcase import OpCase


def _alloc_inputs(g: torch.Generator) -> tuple[tuple, dict]:
    dims = tuple(int(x) for x in torch.randint(1, 9, (3,), generator=g))
    return ((dims, torch.float32), {})


def _same_empty_pool(actual: torch.Tensor, expected: torch.Tensor, inputs) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, "allocate: wrong shape or dtype"
    assert torch.count_nonzero(actual) == 0, "allocate: a new pool must be zero-filled"


CASES = [OpCase("memory", "allocate", "zeroed_pool", _alloc_inputs, compare=_same_empty_pool)]
