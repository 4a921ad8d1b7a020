"""Captured steps: capture a static-shape step once per key, then replay it after copying new inputs.

A step captured here reads only its input buffers (the tensors of the batch it was captured with, and any
extra inputs) and writes its output buffers; every later call with the same key copies the new step's
tensors into those input buffers and replays. Capture runs the step a few times (the platform's warm-up)
with the same inputs, so it changes no state beyond what the step itself writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_core.ops.memory import MemoryOps


@dataclass
class CapturedStep:
    replay: Callable[[], object]
    inputs: list[torch.Tensor]  # the captured input buffers, in the order the caller gives inputs
    #: what the captured function returned (a device graph's replays refill the last one in place)
    results: list[Sequence[torch.Tensor]]
    keepalive: object  # whatever else the graph reads (the captured batch): it must outlive the graph

    @property
    def outputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.results[-1])


class GraphCache:
    """Captured steps by key, on a platform whose ``MemoryOps.capture_graph`` captures."""

    def __init__(self, memory: MemoryOps):
        self.memory = memory
        self.steps: dict[Any, CapturedStep] = {}

    def __contains__(self, key: Any) -> bool:
        return key in self.steps

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)

    def run(
        self,
        key: Any,
        fn: Callable[[], Sequence[torch.Tensor]],
        inputs: list[torch.Tensor],
        keepalive: object,
    ) -> tuple[torch.Tensor, ...]:
        """``fn()`` over ``inputs``: captured on the first call with ``key`` (``inputs`` become the graph's
        input buffers) and replayed, and on later calls replayed after copying ``inputs`` into them."""
        step = self.steps.get(key)
        if step is None:
            out: list[Sequence[torch.Tensor]] = []
            replay = self.memory.capture_graph(lambda: out.append(fn()))
            if replay is None:
                raise RuntimeError("the platform reported graph support but captured nothing")
            step = self.steps[key] = CapturedStep(replay, list(inputs), out, keepalive)
        else:
            for dst, src in zip(step.inputs, inputs, strict=True):
                dst.copy_(src, non_blocking=True)
        step.replay()  # a capture records the step without running it: the first call replays it too
        return step.outputs
