"""V4.1 weight slots and the checkpoint loader for DeepSeek's published layout (``docs/v41_reference.md``, 7).

Each slot says how its tensor is *stored*, and that decides what the loader accepts and what the layer gets:

| stored | checkpoint | runtime value |
|---|---|---|
| ``fp8`` | F8_E4M3 ``[out, in]`` + ``.scale`` F8_E8M0 ``[ceil(out/32), ceil(in/32)]`` | ``QuantizedWeight`` ``fp8_block32`` |
| ``fp4`` | I8 / U8 ``[out, in/2]`` (packed e2m1) + ``.scale`` ``[out, in/32]`` | ``QuantizedWeight`` ``fp4_e2m1`` |
| ``rows8`` | F8_E4M3 ``[rows, dim]`` + ``.scale`` ``[rows, dim/32]`` (Engram tables) | ``EngramTable`` (memory-mapped) |
| ``bf16`` | BF16 (any floating dtype) | the model dtype (``float32`` on the CPU: exact) |
| ``f32`` | F32 (any floating dtype) | float32 |

The loader streams: every shard is opened memory-mapped (``safe_open``) and tensors are read one at a time
into their slot, so host memory never holds more than one tensor beyond the weights kept. Before anything is
read, every missing, unexpected, mis-shaped and mis-typed tensor is collected and reported in one
:class:`CheckpointError` naming the tensor and its file. ``mtp.*`` (the DSpark draft stages) are slots of the
model when the config has a DSpark head (``dspark_block_size``); otherwise they are accepted and skipped. With expert parallelism, ``owns_expert(layer, expert)``
says which routed experts this rank holds: the others' tensors are checked (headers only) and never read.
Engram tables (``rows8``) are memory-mapped, not read (:mod:`.engram_tier`), so the finite-value check does
not scan them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointError, CheckpointReader, problem_list
from deepinfer_core.models.deepseek_v4.params import Module, Slot
from deepinfer_core.models.deepseek_v41.engram_tier import map_table
from deepinfer_core.models.weight_checks import FLOAT_DTYPES, LoadOptions, nonfinite_count
from deepinfer_core.ops.quant_formats import fp4_data_to_uint8, scale_to_float32
from deepinfer_core.ops.weights import QuantizedWeight

BLOCK = 32  # FP8 weight blocks are 32 x 32; FP4 and Engram scales cover 32 values of a row
SCALED = {"fp8": ("F8_E4M3",), "fp4": ("I8", "U8"), "rows8": ("F8_E4M3",)}
SCALE_TYPES = ("F8_E8M0", "F32", "BF16")
#: checkpoint prefixes accepted and skipped when the model has no slots for them (DSpark off in the config)
SKIPPED_PREFIXES = ("mtp.",)
#: a routed expert's tensors: ``layers.<layer>.ffn.experts.<expert>.``
EXPERT_KEY = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.")
#: ``(layer, expert) -> bool``: whether this rank holds that routed expert
OwnsExpert = Callable[[int, int], bool]


@dataclass
class LoadedTensors:
    """What a load read from the checkpoint: tensor names (weights and scales) and their bytes."""

    names: list[str] = field(default_factory=list)
    bytes_read: int = 0
    mapped: list[str] = field(default_factory=list)  # Engram tables: memory-mapped, not read

    def add(self, key: str, t: torch.Tensor) -> None:
        self.names.append(key)
        self.bytes_read += t.numel() * t.element_size()


class StoredSlot(Slot):
    """A :class:`Slot` with the storage format DeepSeek's V4.1 checkpoint uses for it."""

    def __init__(self, key: str, shape: tuple[int, ...], stored: str):
        super().__init__(key, shape, "linear" if stored in SCALED else "float32")
        self.stored = stored

    def expected(self) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """``(data shape, scale shape or None)`` as stored."""
        if self.stored == "fp8":
            out_f, in_f = self.shape
            return self.shape, (math.ceil(out_f / BLOCK), math.ceil(in_f / BLOCK))
        if self.stored == "fp4":
            out_f, in_f = self.shape
            return (out_f, in_f // 2), (out_f, in_f // BLOCK)
        if self.stored == "rows8":
            rows, dim = self.shape
            return self.shape, (rows, dim // BLOCK)
        return self.shape, None

    def load(
        self, data: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.value = self._convert(data, scale, dtype, device)

    def _convert(self, data, scale, dtype, device) -> Any:
        if self.stored == "fp8":
            s = scale_to_float32(scale).to(device)
            return QuantizedWeight(data.to(device), s, "fp8_block32", tuple(self.shape))
        if self.stored == "fp4":
            s = scale_to_float32(scale).to(device)
            return QuantizedWeight(fp4_data_to_uint8(data).to(device), s, "fp4_e2m1", tuple(self.shape))
        if self.stored == "rows8":
            return data.to(device), scale_to_float32(scale).to(device)
        if self.stored == "f32":
            return data.to(device=device, dtype=torch.float32)
        return data.to(device=device, dtype=dtype)


def fp8(key: str, out_f: int, in_f: int) -> StoredSlot:
    return StoredSlot(key, (out_f, in_f), "fp8")


def bf16(key: str, *shape: int) -> StoredSlot:
    return StoredSlot(key, tuple(shape), "bf16")


def f32(key: str, *shape: int) -> StoredSlot:
    return StoredSlot(key, tuple(shape), "f32")


def _problem(slot: StoredSlot, reader: CheckpointReader, key: str, scale_key: str | None) -> str | None:
    dtype, shape = reader.info(key)
    want, want_scale = slot.expected()
    if want_scale is not None:
        if dtype not in SCALED[slot.stored]:
            return f"mis-typed: {key} ({reader.file_of(key)}): stored as {dtype}, expected {SCALED[slot.stored][0]}"
        if scale_key is None:
            return f"missing: {key[: -len('weight')]}scale (the scale of {key}, {reader.file_of(key)})"
        s_dtype, s_shape = reader.info(scale_key)
        if s_dtype not in SCALE_TYPES:
            return (
                f"mis-typed: {scale_key} ({reader.file_of(scale_key)}): stored as {s_dtype}, expected F8_E8M0"
            )
        if shape != want or s_shape != want_scale:
            return (
                f"mis-shaped: {key} ({reader.file_of(key)}): {dtype} data {list(shape)} / scale {list(s_shape)}, "
                f"expected {list(want)} / {list(want_scale)}"
            )
        return None
    if dtype not in FLOAT_DTYPES:
        return f"mis-typed: {key} ({reader.file_of(key)}): stored as {dtype}, expected a floating dtype"
    if shape != want:
        return f"mis-shaped: {key} ({reader.file_of(key)}): expected {list(want)}, got {list(shape)}"
    return None


def plan_load(model: Module, reader: CheckpointReader) -> dict[str, tuple[StoredSlot, str | None]]:
    """Checkpoint key -> (slot, scale key); raises one :class:`CheckpointError` listing every problem."""
    slots = {name: s for name, s in model.named_slots() if isinstance(s, StoredSlot)}
    keys = set(reader.keys())
    problems: list[str] = []
    plan: dict[str, tuple[StoredSlot, str | None]] = {}
    for name, slot in slots.items():
        if name not in keys:
            problems.append(f"missing: {name}")
            continue
        scale_key = name[: -len("weight")] + "scale" if name.endswith(".weight") else None
        scale_key = scale_key if scale_key in keys and slot.stored in SCALED else None
        why = _problem(slot, reader, name, scale_key)
        if why:
            problems.append(why)
        plan[name] = (slot, scale_key)
    used = set(plan) | {s for _, s in plan.values() if s}
    problems += [
        f"unexpected: {k} ({reader.file_of(k)})"
        for k in sorted(keys - used)
        if not k.startswith(SKIPPED_PREFIXES)
    ]
    if problems:
        raise CheckpointError(problem_list(f"checkpoint {reader.path} does not match the model", problems))
    return plan


def owned(key: str, owns_expert: OwnsExpert | None) -> bool:
    """Whether this rank reads ``key``: every tensor but the routed experts it does not hold."""
    m = EXPERT_KEY.match(key) if owns_expert is not None else None
    return m is None or owns_expert(int(m[1]), int(m[2]))


def load_weights(
    model: Module,
    reader: CheckpointReader,
    dtype: torch.dtype,
    device: torch.device,
    options: LoadOptions,
    owns_expert: OwnsExpert | None = None,
) -> LoadedTensors:
    """Fill every slot of ``model`` from ``reader``, one tensor at a time, then call ``post_load``. Routed
    experts that ``owns_expert`` refuses stay unread (their slots keep ``None``)."""
    read = LoadedTensors()
    for key, (slot, scale_key) in plan_load(model, reader).items():
        if not owned(key, owns_expert):
            continue
        if slot.stored == "rows8":  # an Engram table: memory-mapped, read by row at run time
            slot.value = map_table(reader, key, scale_key, device)
            read.mapped.append(key)
            continue
        data = reader.get(key)
        scale = reader.get(scale_key) if scale_key else None
        if options.check_weights_finite:
            for name, t in ((key, data), (scale_key, scale)):
                bad = nonfinite_count(t) if t is not None else 0
                if bad:
                    raise CheckpointError(
                        f"checkpoint {reader.path}: {name} ({reader.file_of(name)}) holds {bad} non-finite "
                        "values (NaN or Inf); a trusted checkpoint can skip this check with "
                        "check_weights_finite=False"
                    )
        read.add(key, data)
        if scale is not None:
            read.add(scale_key, scale)
        slot.load(data, scale, dtype, device)
        del data, scale
    for m in model.modules():
        m.post_load()
    return read
