"""Reference ops: pure PyTorch, CPU, batch invariant. The conformance kit checks every backend against them."""

from __future__ import annotations

import importlib
from typing import Any

from deepinfer_core.ops.reference.attention import ReferenceAttentionOps
from deepinfer_core.ops.reference.dense import ReferenceDenseOps
from deepinfer_core.ops.reference.moe import ReferenceMoEOps

_REFERENCE = {
    "dense": "deepinfer_core.ops.reference.dense:ReferenceDenseOps",
    "attention": "deepinfer_core.ops.reference.attention:ReferenceAttentionOps",
    "moe": "deepinfer_core.ops.reference.moe:ReferenceMoEOps",
    "sampling": "deepinfer_core.ops.reference.sampling:ReferenceSamplingOps",
    "memory": "deepinfer_core.ops.reference.memory:ReferenceMemoryOps",
    "comm": "deepinfer_core.ops.reference.comm:ReferenceCommOps",
}


def reference_op(concern: str) -> Any:
    """A new reference ops object for ``concern`` (``dense``, ``attention``, ``moe``, ``sampling``,
    ``memory``, ``comm``); a platform plugin subclasses or delegates to it for what it does not accelerate."""
    mod, attr = _REFERENCE[concern].split(":")
    return getattr(importlib.import_module(mod), attr)()


__all__ = ["ReferenceAttentionOps", "ReferenceDenseOps", "ReferenceMoEOps", "reference_op"]
