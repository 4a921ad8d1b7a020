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
    #: how the case calls the op: ``run(backends, args, kwargs)``, for a protocol of several calls (dispatch
    #: then combine) or a property of the platform (graph capture); default: the method ``op`` of ``concern``
    run: Callable[[Any, tuple, dict], Any] | None = None
    #: the arguments the op writes into (positions in ``args``, or keyword names): the result compared is
    #: then ``(return value, *those arguments after the call)``
    writes: tuple[int | str, ...] = ()
    #: processes the case runs on; above 1, a gloo group on the CPU (:mod:`deepinfer_core.testing.world`)
    world: int = 1
    #: why the case does not apply to a platform's backends (``None``: it does), e.g. it needs graphs
    requires: Callable[[Any], str | None] | None = None

    def skip_reason(self, backends: Any) -> str | None:
        """Why the case tests something ``backends`` does not declare or cannot run here; ``None`` if it
        applies."""
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in getattr(
            backends.attention, "kv_cache_dtypes", ("auto",)
        ):
            return f"the platform does not declare kv_cache_dtype={self.kv_cache_dtype!r}"
        if self.world > 1:
            dist_backend = getattr(getattr(backends, "comm", None), "dist_backend", None)
            if dist_backend != "gloo":
                return (
                    f"runs on {self.world} processes over gloo; the platform's collectives use "
                    f"{dist_backend!r}"
                )
        return self.requires(backends) if self.requires is not None else None

    def applies_to(self, backends: Any) -> bool:
        """False when the case tests an optional feature ``backends`` does not declare."""
        return self.skip_reason(backends) is None

    @property
    def id(self) -> str:
        return f"{self.concern}.{self.op}[{self.name}]"
