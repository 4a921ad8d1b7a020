"""Weight containers shared by the dense and MoE ops.

A weight is either a plain ``torch.Tensor`` ``[out, in]`` (BF16/FP32) or a :class:`QuantizedWeight`
that stays quantized in memory; ops dequantize it block by block (reference) or natively (devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

QuantFormat = Literal["fp8_block", "fp8_block32", "fp4_e2m1"]
#: rows (and columns) of one scale block of each FP8 format
FP8_SCALE_ROWS = {"fp8_block": 128, "fp8_block32": 32}


@dataclass
class QuantizedWeight:
    """A quantized ``[out, in]`` matrix.

    - ``fp8_block``: ``data`` is ``float8_e4m3fn [out, in]``; ``scale`` is ``float32 [ceil(out/128), ceil(in/128)]``
      (one dequantization multiplier per 128x128 block; checkpoints with ``scale_fmt: ue8m0`` are
      converted to float32 powers of two at load time).
    - ``fp8_block32``: the same with one scale per 32x32 block, ``[ceil(out/32), ceil(in/32)]`` (DeepSeek-V4.1).
    - ``fp4_e2m1``: ``data`` is ``uint8 [out, in/2]``, two e2m1 codes per byte, low nibble first
      (element ``2j`` in bits 0-3, ``2j+1`` in bits 4-7); ``scale`` is ``float32 [out, in/32]``
      (ue8m0 powers of two, one per 32 input values).

    ``act_block``: 0, the GEMM multiplies its input as it is; 32, the input goes through FP8 e4m3 with one
    ue8m0 scale per 32 values first (DeepSeek-V4.1's release numerics, :mod:`deepinfer_core.ops.act_quant`).
    """

    data: torch.Tensor
    scale: torch.Tensor
    format: QuantFormat
    shape: tuple[int, int]  # logical [out, in]
    act_block: int = 0

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]


Weight = torch.Tensor | QuantizedWeight


@dataclass
class ExpertWeights:
    """The routed experts of one MoE layer, SwiGLU ``w2(silu(w1 x) * (w3 x))``.

    Each of ``w1``, ``w3`` (``[I, D]``) and ``w2`` (``[D, I]``) is a list with one :data:`Weight` per
    *local* expert. ``expert_ids`` maps a local index to the global expert id (identity without EP).
    """

    w1: list[Weight]
    w3: list[Weight]
    w2: list[Weight]
    expert_ids: list[int]

    @property
    def num_local_experts(self) -> int:
        return len(self.w1)


def concat_rows(weights: list[Weight]) -> tuple[Weight, list[Weight]] | None:
    """Linears that read the same input as one ``[sum(out), in]`` matrix, plus each one's row view of it, or
    ``None`` where they cannot share a matrix: plain tensors of one dtype, or FP8-block weights of one format
    whose row counts (all but the last) are whole scale blocks (128 rows, or 32 for ``fp8_block32``). One GEMV
    instead of several at decode."""
    if len({w.shape[1] for w in weights}) != 1 or len(weights) < 2:
        return None
    if all(isinstance(w, torch.Tensor) for w in weights):
        if len({w.dtype for w in weights}) != 1:
            return None
        fused = torch.cat(weights, dim=0)
        rows = [w.shape[0] for w in weights]
        return fused, list(fused.split(rows, dim=0))
    if not all(isinstance(w, QuantizedWeight) for w in weights):
        return None
    fmt = weights[0].format
    block = FP8_SCALE_ROWS.get(fmt)
    if (
        block is None
        or any(w.format != fmt for w in weights)
        or any(w.out_features % block for w in weights[:-1])
    ):
        return None
    if len({w.act_block for w in weights}) != 1:
        return None
    data = torch.cat([w.data for w in weights], dim=0)
    scale = torch.cat([w.scale for w in weights], dim=0)
    act = weights[0].act_block
    fused = QuantizedWeight(data, scale, fmt, (data.shape[0], data.shape[1]), act)
    views, r = [], 0
    for w in weights:
        n = w.out_features
        views.append(
            QuantizedWeight(
                data[r : r + n], scale[r // block : -(-(r + n) // block)], fmt, (n, w.in_features), act
            )
        )
        r += n
    return fused, views
