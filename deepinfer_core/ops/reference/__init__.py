"""Reference ops: pure PyTorch, CPU, batch invariant. The conformance kit checks every backend against them."""

from deepinfer_core.ops.reference.attention import ReferenceAttentionOps
from deepinfer_core.ops.reference.dense import ReferenceDenseOps
from deepinfer_core.ops.reference.moe import ReferenceMoEOps

__all__ = ["ReferenceAttentionOps", "ReferenceDenseOps", "ReferenceMoEOps"]
