"""A row-wise op replayed from captured CUDA graphs, one per bucket of rows: a few launches in place of many.

``RowGraphs(fn)`` wraps ``fn(*tensors) -> tensor`` whose row ``b`` of the result depends only on row ``b`` of each
argument (the sampler's ``probs``: ~30 torch launches a call, each ~10 us of host time on the H200's host,
which the overlapped engine cannot hide at small batches, RESULTS.md v26). A call with ``B`` rows copies its
arguments into the first ``B`` rows of the bucket's static buffers (the bucket: the smallest of ``buckets`` at
least ``B``), replays, and returns a copy of the first ``B`` result rows, so a result stays valid after the next
call. Rows past ``B`` hold whatever an earlier call left: computed, never returned. Eager (``fn`` itself) when
``B`` is over the largest bucket, when the arguments are not on one CUDA device, or while a capture is running
(an op called inside another graph's capture). ``capture`` is the platform's (``GraphPool.capture``); the
tests give a CPU stand-in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: row buckets: a ``[16, 129280]`` float32 intermediate is 8 MB, and the graphs keep their memory
BUCKETS = (1, 2, 4, 8, 16)


class RowGraphs:
    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        capture: Callable[[torch.device], Callable[[Callable[[], object]], Callable[[], object]]]
        | None = None,
        buckets: tuple[int, ...] = BUCKETS,
    ):
        self.fn, self.buckets = fn, buckets
        self._capture = capture
        self.steps: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor], Callable[[], object]]] = {}
        self._pools: dict[torch.device, object] = {}

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        B = args[0].shape[0]
        bucket = next((b for b in self.buckets if b >= B), None)
        if bucket is None or B == 0 or not self._graphable(args):
            return self.fn(*args)
        key = (bucket, *((tuple(a.shape[1:]), a.dtype, a.device) for a in args))
        step = self.steps.get(key)
        if step is None:
            bufs = [torch.zeros((bucket, *a.shape[1:]), dtype=a.dtype, device=a.device) for a in args]
            _copy([b[:B] for b in bufs], args)
            made: list[torch.Tensor] = []
            replay = self._capture_on(args[0].device)(lambda: made.append(self.fn(*bufs)))
            del made[:-1]  # the warm-up runs' results; the last is the graph's output buffer
            step = self.steps[key] = (bufs, made, replay)
        else:
            _copy([b[:B] for b in step[0]], args)
        step[2]()
        return step[1][-1][:B].clone()

    def _graphable(self, args: tuple[torch.Tensor, ...]) -> bool:
        if self._capture is not None:
            return True
        dev = args[0].device
        return (
            dev.type == "cuda"
            and all(a.device == dev for a in args)
            and not torch.cuda.is_current_stream_capturing()
        )

    def _capture_on(self, device: torch.device) -> Callable[[Callable[[], object]], Callable[[], object]]:
        if self._capture is not None:
            return self._capture(device)
        from deepinfer_cuda_sm100.ops.memory import GraphPool

        pool = self._pools.get(device)
        if pool is None:
            pool = self._pools[device] = GraphPool(device)
        return pool.capture


def _copy(dsts: list[torch.Tensor], srcs: tuple[torch.Tensor, ...]) -> None:
    """``dst.copy_(src)`` pairwise, one ``_foreach_copy_`` per dtype (one launch each on a GPU)."""
    groups: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for d, s in zip(dsts, srcs, strict=True):
        a, b = groups.setdefault(d.dtype, ([], []))
        a.append(d)
        b.append(s)
    for a, b in groups.values():
        torch._foreach_copy_(a, b, non_blocking=True)
