"""One conformance case: how to make random inputs for an op, and how to compare results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class OpCase:
    concern: str  # "dense", "attention", "moe", "sampling", "memory", "comm"
    op: str  # method name on the concern's ops object
    name: str  # what this case covers, e.g. "fp8_block"
    make_inputs: Callable[[torch.Generator], tuple[tuple, dict]]
    atol: float = 1e-5
    rtol: float = 1e-5
    #: compare(actual, expected, inputs) raises AssertionError; default: torch.testing.assert_close
    compare: Callable[[Any, Any, Any], None] | None = None

    @property
    def id(self) -> str:
        return f"{self.concern}.{self.op}[{self.name}]"
