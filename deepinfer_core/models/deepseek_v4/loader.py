"""Generic checkpoint loading: match checkpoint keys to the model's slots, check everything, then load.

All problems (missing, unexpected and mis-shaped tensors) are collected first and reported in one
:class:`CheckpointError`; only a clean checkpoint is read, one tensor at a time, each handed to the
``weight_loader`` of the slot(s) it fills.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointError, CheckpointReader, problem_list
from deepinfer_core.models.deepseek_v4.config import DeepseekV4Config
from deepinfer_core.models.deepseek_v4.layout import (
    Source,
    build_plan,
    canonical_name,
    layout_name,
    scale_companions,
)
from deepinfer_core.models.deepseek_v4.params import Module
from deepinfer_core.models.weight_checks import SCALE_DTYPES, LoadOptions, dtype_problem, nonfinite_count
from deepinfer_core.ops.quant_formats import FP4_BLOCK, FP8_BLOCK

ARCHITECTURE = "DeepseekV4ForCausalLM"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
ONE_BYTE_FP4 = {"U8", "I8"}


def read_config(path: Path) -> tuple[DeepseekV4Config, dict[str, Any]]:
    """``config.json`` of ``path``, checked to be a DeepSeek-V4 causal LM."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: invalid JSON: {e}") from e
    archs = raw.get("architectures") or []
    if archs and ARCHITECTURE not in archs or not archs and raw.get("model_type") != "deepseek_v4":
        raise CheckpointError(
            f"{file}: unknown architecture {archs or raw.get('model_type')!r}; this model class loads {ARCHITECTURE!r} (model_type 'deepseek_v4')"
        )
    return DeepseekV4Config.from_dict(raw), raw


def count_mtp_modules(keys: list[str], declared: int) -> int:
    """How many MTP modules the checkpoint carries: ``mtp.0 .. mtp.{n-1}`` (transformers layouts drop them)."""
    names = [canonical_name(k).split(".") for k in keys]
    present = {int(p[1]) for p in names if p[0] == "mtp" and len(p) > 1 and p[1].isdigit()}
    n = 0
    while n in present and n < declared:
        n += 1
    return n


def _check_shape(
    src: Source, dtype: str, shape: tuple[int, ...], scale: tuple[int, ...] | None
) -> str | None:
    """Why ``src``'s tensor does not fit, or ``None``."""
    if scale is None:
        if dtype == "F8_E4M3" or (src.quantizable and dtype == "F4"):
            return f"{dtype} weight without a scale companion (.scale or .weight_scale_inv)"
        return None if shape == src.shape else f"expected {list(src.shape)}, got {list(shape)}"
    out_f, in_f = src.shape
    if dtype == "F8_E4M3":
        want, want_s = (out_f, in_f), (math.ceil(out_f / FP8_BLOCK), math.ceil(in_f / FP8_BLOCK))
    elif dtype == "F4" or dtype in ONE_BYTE_FP4:
        want = (out_f, in_f) if dtype == "F4" else (out_f, in_f // 2)
        want_s = (out_f, in_f // FP4_BLOCK)
    else:
        return f"dtype {dtype} with a scale companion; expected F8_E4M3 or packed FP4"
    if shape != want or scale != want_s:
        return f"{dtype} data {list(shape)} / scale {list(scale)}, expected {list(want)} / {list(want_s)}"
    return None


def validate(
    slots: dict[str, tuple[tuple[int, ...], bool]],
    reader: CheckpointReader,
    kinds: dict[str, str] | None = None,
) -> tuple[dict[str, Source], dict[str, str | None]]:
    """Match the checkpoint to ``slots``; returns ``(plan, scale key of each planned key or None)`` or raises
    one :class:`CheckpointError` listing every missing, unexpected, mis-shaped and mis-typed tensor.
    ``kinds``: slot name -> slot kind, for the dtype check."""
    keys = reader.keys()
    companions = scale_companions(set(keys))
    scale_keys = set(companions.values())
    plan, problems = build_plan(slots, [k for k in keys if k not in scale_keys])
    problems = [f"{p} ({reader.file_of(p.split()[1])})" for p in problems]
    covered = {t for src in plan.values() for t, _ in src.targets}
    problems += [f"missing: {name}" for name in slots if name not in covered]
    scales: dict[str, str | None] = {}
    for key, src in plan.items():
        scale_key = companions.get(key)
        if scale_key and not src.quantizable:
            problems.append(
                f"unexpected: {scale_key} ({reader.file_of(scale_key)}): {key} cannot be quantized"
            )
            scale_key = None
        dtype, shape = reader.info(key)
        why = _check_shape(src, dtype, shape, reader.info(scale_key)[1] if scale_key else None)
        if why:
            problems.append(f"mis-shaped: {key} ({reader.file_of(key)}): {why}")
        kind = (kinds or {}).get(src.targets[0][0])
        why = _check_dtypes(kind, dtype, reader.info(scale_key)[0] if scale_key else None)
        if why:
            problems.append(f"mis-typed: {key} ({reader.file_of(key)}): {why}")
        scales[key] = scale_key
    problems += [
        f"unexpected: {k} ({reader.file_of(k)})"
        for k in sorted(scale_keys - {s for s in scales.values() if s})
    ]
    if problems:
        raise CheckpointError(problem_list(f"checkpoint {reader.path} does not match the model", problems))
    return plan, scales


def _check_dtypes(kind: str | None, dtype: str, scale_dtype: str | None) -> str | None:
    if kind is None:
        return None
    why = dtype_problem(kind, dtype, scale_dtype is not None)
    if why is None and scale_dtype is not None and scale_dtype not in SCALE_DTYPES:
        why = f"its scale is stored as {scale_dtype}; scales must be F8_E8M0 or floating"
    return why


def load_weights(
    model: Module,
    reader: CheckpointReader,
    dtype: torch.dtype,
    device: torch.device,
    options: LoadOptions = LoadOptions(),
) -> str:
    """Fill every slot of ``model`` from ``reader``, one checkpoint tensor at a time; returns the layout name.
    :raises CheckpointError: naming the tensor and its file (see :mod:`~deepinfer_core.models.weight_checks`)."""
    slots = dict(model.named_slots())
    shapes = {n: (s.shape, s.kind == "linear") for n, s in slots.items()}
    plan, scales = validate(shapes, reader, {n: s.kind for n, s in slots.items()})
    for key, src in plan.items():
        tensor = reader.get(key)
        scale = reader.get(scales[key]) if scales[key] else None
        if options.check_weights_finite:
            _check_finite(reader, key, tensor, scales[key], scale)
        for name, extract in src.targets:
            try:
                slots[name].weight_loader(extract(tensor), scale, dtype, device)
            except ValueError as e:
                raise CheckpointError(
                    f"checkpoint {reader.path}: {key} ({reader.file_of(key)}): {e}"
                ) from None
        del tensor, scale
    for m in model.modules():
        m.post_load()
    return layout_name(reader.keys())


def _check_finite(
    reader: CheckpointReader,
    key: str,
    tensor: torch.Tensor,
    scale_key: str | None,
    scale: torch.Tensor | None,
) -> None:
    for name, t in ((key, tensor), (scale_key, scale)):
        bad = nonfinite_count(t) if t is not None else 0
        if bad:
            raise CheckpointError(
                f"checkpoint {reader.path}: {name} ({reader.file_of(name)}) holds {bad} non-finite values "
                "(NaN or Inf); a trusted checkpoint can skip this check with check_weights_finite=False"
            )
