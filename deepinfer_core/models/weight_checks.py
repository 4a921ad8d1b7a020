"""Checks on untrusted checkpoint tensors, for every architecture's loader.

A checkpoint is data from somewhere else. Before a tensor becomes a weight: its stored dtype must be one
the slot can take (metadata only, before anything is read), its floating values must be finite (NaN and
Inf weights otherwise turn into empty or garbage output with no error), and integer tables must hold ids
inside their range. The finite check reads every value once more, a small cost next to reading it from
disk; ``check_weights_finite=False`` skips it for a trusted checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: safetensors dtype names
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
INT_DTYPES = frozenset({"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64"})
QUANT_DTYPES = frozenset({"F8_E4M3", "F4", "I8", "U8"})  # data of FP8 / packed FP4 weights (with a scale)
SCALE_DTYPES = FLOAT_DTYPES | frozenset({"F8_E8M0"})


@dataclass(frozen=True)
class LoadOptions:
    """How much a loader trusts the checkpoint (``EngineConfig`` fields of the same names)."""

    #: check floating weights and scales for NaN / Inf
    check_weights_finite: bool = True
    #: let shard files (or their symlink targets) lie outside the checkpoint directory
    allow_external_shards: bool = False


def dtype_problem(kind: str, dtype: str, quantized: bool) -> str | None:
    """Why a stored ``dtype`` cannot fill a slot of ``kind`` (``index``, ``linear``, ``float32``,
    ``model``), or None. ``quantized``: the tensor has a scale companion."""
    if kind == "index":
        ok, want = dtype in INT_DTYPES, "an integer dtype"
    elif kind == "linear" and quantized:
        ok, want = dtype in QUANT_DTYPES, "F8_E4M3 or packed FP4 with a scale"
    else:
        ok, want = dtype in FLOAT_DTYPES, "a floating dtype (F32, F16, BF16, F64)"
    return None if ok else f"stored as {dtype}; this tensor must be {want}"


def nonfinite_count(t: torch.Tensor) -> int:
    """Number of NaN / Inf values of ``t`` (their encodings in FP8 e4m3 and e8m0; FP4 has none)."""
    if t.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        return int((~torch.isfinite(t)).sum())
    if t.dtype == torch.float8_e4m3fn:
        return int(((t.view(torch.uint8) & 0x7F) == 0x7F).sum())
    if t.dtype == getattr(torch, "float8_e8m0fnu", None):
        return int((t.view(torch.uint8) == 0xFF).sum())
    return 0


def check_index_range(t: torch.Tensor, low: int, high: int) -> str | None:
    """Why the integer table ``t`` is not within ``[low, high)``, or None."""
    if t.numel() == 0:
        return None
    lo, hi = int(t.min()), int(t.max())
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        return f"holds id {bad}, outside [{low}, {high})"
    return None
