"""Activation quantisation of quantized GEMMs: DeepSeek-V4.1's release numerics (W8A8).

DeepSeek's V4.1 reference quantises the input of every FP8 and FP4 GEMM (``linear()`` in its ``model.py``): FP8
e4m3 codes with one ue8m0 (power-of-two) scale per 32 consecutive values of a row, the quantiser of
:func:`deepinfer_core.ops.kv_quant.quantize_fp8`, then a float32-accumulated product of the dequantised
activations and weights. The engine runs it when ``EngineConfig.activation_quant == "fp8"``: the model marks
each weight the release multiplies that way (:attr:`QuantizedWeight.act_block` = 32), and every backend's
``linear``, ``grouped_linear``, ``swiglu_mlp`` and ``experts`` take such a weight's input through
:func:`act_input` first (or an equivalent kernel: a platform's own quantiser must give the same codes and scales).

The round trip is exact in bf16: a dequantised value is an e4m3 code (at most 4 significant bits) times a power
of two, so the GEMM over the round-tripped activations equals the release's FP8 x FP8 product up to the order
of the float32 sums. Routed experts scale the down projection's input by the routing weight *before* it is
quantised, as the release does (``Expert.forward``); without activation quantisation the weight multiplies the
output (transformers' order, DeepSeek-V4's oracle).
"""

from __future__ import annotations

import torch

from deepinfer_core.ops.kv_quant import dequantize_fp8, quantize_fp8
from deepinfer_core.ops.weights import QuantizedWeight, Weight

#: the values of ``EngineConfig.activation_quant``
ACTIVATION_QUANT_MODES = ("none", "fp8")
#: values per ue8m0 scale of V4.1's activation quantiser
FP8_ACT_BLOCK = 32


def fp8_act_roundtrip(x: torch.Tensor, block: int = FP8_ACT_BLOCK) -> torch.Tensor:
    """``x [..., n]`` through FP8 e4m3 with one ue8m0 scale per ``block`` values and back, in ``x.dtype``."""
    return dequantize_fp8(*quantize_fp8(x, block), block).to(x.dtype)


def act_block(weight: Weight) -> int:
    """Values per activation scale the GEMM with ``weight`` quantises its input with; 0: none."""
    return weight.act_block if isinstance(weight, QuantizedWeight) else 0


def act_input(x: torch.Tensor, weight: Weight) -> torch.Tensor:
    """The input a GEMM with ``weight`` multiplies: ``x`` itself, or its FP8 round trip where the weight says so."""
    block = act_block(weight)
    return fp8_act_roundtrip(x, block) if block else x


def mark_activation_quant(weights: list[Weight], block: int = FP8_ACT_BLOCK) -> None:
    """Set ``act_block`` on every quantized weight of ``weights`` (plain tensors are left alone: the release
    multiplies them in the model dtype)."""
    for w in weights:
        if isinstance(w, QuantizedWeight):
            w.act_block = block
