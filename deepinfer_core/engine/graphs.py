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
            copy_inputs(step.inputs, inputs)
        step.replay()  # a capture records the step without running it: the first call replays it too
        return step.outputs


def copy_inputs(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
    """``dst.copy_(src)`` for each pair, one ``_foreach_copy_`` per dtype (on a GPU one multi-tensor launch for
    a dtype's inputs where it was one copy each: 12 for a V4 decode step), skipping a source that already is
    its buffer."""
    groups: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    if len(dsts) != len(srcs):
        raise ValueError(f"{len(srcs)} inputs for a step captured with {len(dsts)}")
    for dst, src in zip(dsts, srcs, strict=True):
        if src is dst:
            continue
        d, s = groups.setdefault((dst.dtype, src.dtype, src.device), ([], []))
        d.append(dst)
        s.append(src)
    for d, s in groups.values():
        torch._foreach_copy_(d, s, non_blocking=True)
