"""The resolved backend objects an engine runs on: one per concern, fixed at engine build time."""

from __future__ import annotations

from dataclasses import dataclass, fields

from deepinfer_core.ops.attention import AttentionOps
from deepinfer_core.ops.comm import CommOps
from deepinfer_core.ops.dense import DenseOps
from deepinfer_core.ops.memory import MemoryOps
from deepinfer_core.ops.moe import MoEOps
from deepinfer_core.ops.sampling import SamplingOps

CONCERNS = ("dense", "attention", "moe", "sampling", "memory", "comm")


@dataclass(frozen=True)
class Backends:
    """Plain objects, no pluggy: the step loop calls these directly (and graph capture can see them)."""

    platform: str
    dense: DenseOps
    attention: AttentionOps
    moe: MoEOps
    sampling: SamplingOps
    memory: MemoryOps
    comm: CommOps

    def describe(self) -> dict[str, str]:
        """``{concern: implementing class}``, for ``deepinfer plugins`` and logs."""
        return {
            f.name: type(getattr(self, f.name)).__qualname__ for f in fields(self) if f.name != "platform"
        }
