"""The vision tower's checkpoint slots: ``vision.*``, ``aligner.*`` and the span delimiters, under their
published names (no prefix of ours), loaded by the model's generic loader and turned into a
:class:`~.tower.VisionTower` once every slot is filled."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from deepinfer_core.models.deepseek_v4.params import Module, Slot
from deepinfer_core.models.deepseek_v41.vision.config import VisionConfig
from deepinfer_core.models.deepseek_v41.vision.tower import VisionTower, expected_shapes
from deepinfer_core.models.deepseek_v41.weights import StoredSlot


class VisionWeights(Module):
    def __init__(self, cfg: VisionConfig, dtype: torch.dtype):
        self.cfg, self.dtype = cfg, dtype
        self.slots = {
            name: StoredSlot(
                name, shape, "f32" if name.endswith("norm.weight") or ".norm" in name else "bf16"
            )
            for name, shape in expected_shapes(cfg).items()
        }
        self.tower: VisionTower | None = None

    def named_slots(self, prefix: str = "") -> Iterator[tuple[str, Slot]]:
        """The published names, whatever attribute holds this module."""
        yield from self.slots.items()

    def post_load(self) -> None:
        self.tower = VisionTower(self.cfg, {k: s.value for k, s in self.slots.items()}, self.dtype)
