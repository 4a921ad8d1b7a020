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
    #: an optional feature the case needs: a ``kv_cache_dtype`` the attention ops must list (else skipped)
    kv_cache_dtype: str = "auto"
    #: ``op`` is a :class:`~deepinfer_core.ops.fusions.Fusion`: run as the backend resolves it (its fused op where
    #: declared, else the core's composition of its plain ops), expected: the composition of the reference's ops
    fusion: bool = False

    def applies_to(self, backends: Any) -> bool:
        """False when the case tests an optional feature ``backends`` does not declare."""
        if self.kv_cache_dtype == "auto":
            return True
        return self.kv_cache_dtype in getattr(backends.attention, "kv_cache_dtypes", ("auto",))

    @property
    def id(self) -> str:
        return f"{self.concern}.{self.op}[{self.name}]"
