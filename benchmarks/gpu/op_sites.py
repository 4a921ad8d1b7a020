"""Which torch operators a step runs, and the engine's or the plugin's line that issued each: a
``TorchDispatchMode`` that counts every operator that is a kernel on a GPU (not views, not metadata). Used on the
CPU by ``launch_count.py`` (under the Triton interpreter, whose own tensor work is paused out) and on the GPU by
``v41_slice.py --op-sites`` (an eager run of a captured step: where a graph's torch kernels come from)."""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: torch operators that launch nothing on a GPU (views, metadata, host-side scalars)
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "expand", "slice", "select", "unsqueeze", "squeeze", "permute", "transpose",
    "t", "as_strided", "alias", "detach", "lift_fresh", "split", "split_with_sizes", "unbind", "chunk", "narrow",
    "view_as_real", "view_as_complex", "_reshape_alias", "empty", "empty_like", "empty_strided", "unflatten",
    "flatten", "movedim", "diagonal", "sym_size", "sym_stride", "sym_numel", "is_same_size",
}  # fmt: skip
#: operators that return their input (or a view of it) when nothing changes and a copy otherwise: counted only
#: when the result is new memory. Under ``torch.inference_mode`` these reach the mode whole (``to``, not its
#: ``_to_copy``), so a ``weight.float()`` of a bf16 weight shows as ``to``, a copy kernel on a GPU
MAYBE_COPY = {"to", "contiguous", "reshape", "flatten", "type_as", "expand_as"}


def site(within: tuple[str, ...] = ("deepinfer_core", "deepinfer_cuda_sm100")) -> str:
    """The innermost frame of the engine's or the plugin's code (files whose path holds one of ``within``) that
    issued the operator."""
    for f in reversed(traceback.extract_stack()[:-3]):
        if any(w in f.filename for w in within) and "op_sites" not in f.filename:
            return f"{f.filename.split('deepinfer_', 1)[-1]}:{f.lineno} {f.name}"
    return "?"


class OpSites(TorchDispatchMode):
    """Counts operators by name (``ops``), by issuing line (``sites``) and by both (``pairs``) while active and
    not ``paused``."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.sites: Counter = Counter()
        self.pairs: Counter = Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if self.paused or name in NO_KERNEL or name.rstrip("_") in NO_KERNEL:
            return out
        if name in MAYBE_COPY and _same_memory(out, args[0] if args else None):
            return out
        where = site()
        self.ops[name] += 1
        self.sites[where] += 1
        self.pairs[f"{name} @ {where}"] += 1
        return out


def _same_memory(out, src) -> bool:
    """Whether ``out`` is ``src`` or a view of its memory (no copy was made)."""
    if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    return out.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
