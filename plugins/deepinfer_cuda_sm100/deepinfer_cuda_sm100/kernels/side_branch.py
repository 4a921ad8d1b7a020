"""A branch of launches on a side stream, forked from the current stream and joined later, at the first op that
reads what it wrote (in a CUDA graph capture: a branch of the graph, its join an edge).

One branch is pending per device at a time. Its owner calls :func:`fork` with the launches and every tensor they read
or write (held until the join, so the caching allocator cannot hand their memory to the main stream while the side
kernels run), and each op that may read the branch's outputs calls :func:`join` before its first launch, launching
that one without programmatic dependent launch when the join waited (``dispatch.pdl_args(forked=True)``). The
branch's own launches must not use PDL either: their stream's last work is a wait on another stream."""

from __future__ import annotations

from collections.abc import Callable

import torch

#: per CUDA device: the event that ends the pending branch, whether it was recorded in a graph capture, and the
#: tensors its launches use
_PENDING: dict[torch.device, tuple[torch.cuda.Event, bool, tuple[torch.Tensor, ...]]] = {}
_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def fork(device: torch.device, launch: Callable[[], None], held: tuple[torch.Tensor, ...]) -> None:
    """Run ``launch`` on ``device``'s side stream after the work queued on the current stream so far; on a device
    without streams (the interpreter's CPU tensors), now, in order."""
    if device.type != "cuda":
        launch()
        return
    join(device)  # one branch at a time
    main = torch.cuda.current_stream(device)
    side = _STREAMS.get(device)
    if side is None:
        side = _STREAMS[device] = torch.cuda.Stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        launch()
        event = torch.cuda.Event()
        event.record(side)
    _PENDING[device] = (event, torch.cuda.is_current_stream_capturing(), held)


def join(device: torch.device) -> bool:
    """Make ``device``'s current stream wait for the pending branch, if any. -> whether it waited (then the next
    launch must not be a PDL one, whose programmatic edge could stand in for the wait)."""
    if not _PENDING:
        return False
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    event, captured, _held = _PENDING.pop(device, (None, False, ()))
    if event is None or (torch.cuda.is_current_stream_capturing() and not captured):
        return False  # (an eager branch before a capture: ``torch.cuda.graph`` synchronises the device as it begins)
    torch.cuda.current_stream(device).wait_event(event)
    return True
