"""The resolved backend objects an engine runs on: one per concern, fixed at engine build time."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from deepinfer_core.ops.adapt import adapt_attention
from deepinfer_core.ops.attention import AttentionOps
from deepinfer_core.ops.comm import CommOps
from deepinfer_core.ops.dense import DenseOps
from deepinfer_core.ops.fusions import FusedOps, resolve_fusions
from deepinfer_core.ops.memory import MemoryOps
from deepinfer_core.ops.moe import MoEOps
from deepinfer_core.ops.sampling import SamplingOps

CONCERNS = ("dense", "attention", "moe", "sampling", "memory", "comm")


@dataclass(frozen=True)
class Backends:
    """Plain objects, no pluggy: the step loop calls these directly (and graph capture can see them).

    ``fused`` is resolved here, once: the callable of every fused step (the backend's fused op where it
    declares one, else the core's composition of its plain ops; see :mod:`deepinfer_core.ops.fusions`).
    The attention ops are adapted here too (:mod:`deepinfer_core.ops.adapt`)."""

    platform: str
    dense: DenseOps
    attention: AttentionOps
    moe: MoEOps
    sampling: SamplingOps
    memory: MemoryOps
    comm: CommOps
    fused: FusedOps = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.attention is not None:
            adapt_attention(self.attention)
        object.__setattr__(self, "fused", resolve_fusions(self.dense, self.attention))

    def describe(self) -> dict[str, str]:
        """``{concern: implementing class}``, for ``deepinfer plugins`` and logs."""
        return {f.name: type(getattr(self, f.name)).__qualname__ for f in fields(self) if f.name in CONCERNS}
