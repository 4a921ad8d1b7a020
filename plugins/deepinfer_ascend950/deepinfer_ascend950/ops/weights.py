"""Weights as the NPU ops take them: dequantization on the device and expert stacks for grouped matmul.

FP8 per-block and FP4 e2m1 weights are dequantized to the activation dtype on the device (weight-only
dequantization): the torch_npu pages of ``npu_grouped_matmul`` and ``npu_quant_matmul`` used here document
no FP8 128x128-block or MX (ue8m0 per 32) scale layout, so no native quantized GEMM is called; see
``docs/platforms/ascend950.md``. Every e2m1 value times a power of two is exact in bf16, and so is every
e4m3 value times a float32 scale up to bf16 rounding, as in the reference ops.
"""

from __future__ import annotations

import torch

from deepinfer_core.plugin_api import QuantizedWeight, Weight

FP8_BLOCK = 128
#: block edge of each FP8 format: DeepSeek-V4's 128 x 128, V4.1's 32 x 32
FP8_BLOCKS = {"fp8_block": FP8_BLOCK, "fp8_block32": 32}
FP4_BLOCK = 32
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_lut(device: torch.device) -> torch.Tensor:
    """``[16]`` float32: the value of each 4-bit e2m1 code (codes 8-15 are the negatives)."""
    pos = torch.tensor(_E2M1, dtype=torch.float32, device=device)
    return torch.cat([pos, -pos])


def dequantize(qw: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The ``[out, in]`` matrix in ``dtype``, computed on ``qw.data``'s device in one vectorised pass."""
    out_f, in_f = qw.shape
    if qw.format in FP8_BLOCKS:
        b = FP8_BLOCKS[qw.format]
        s = qw.scale.float().repeat_interleave(b, 0)[:out_f].repeat_interleave(b, 1)[:, :in_f]
        return (qw.data.float() * s).to(dtype)
    if qw.format == "fp4_e2m1":
        packed = qw.data.view(torch.uint8) if qw.data.dtype != torch.uint8 else qw.data
        codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).view(out_f, in_f).long()
        vals = e2m1_lut(packed.device)[codes]
        return (vals * qw.scale.float().repeat_interleave(FP4_BLOCK, 1)).to(dtype)
    raise ValueError(f"unknown quantized format {qw.format!r}")


def plain(weight: Weight, dtype: torch.dtype) -> torch.Tensor:
    """A plain ``[out, in]`` matrix in ``dtype`` (quantized weights dequantized on their device)."""
    if isinstance(weight, QuantizedWeight):
        return dequantize(weight, dtype)
    return weight if weight.dtype == dtype else weight.to(dtype)


def gmm_weights(weights: list[Weight], dtype: torch.dtype, max_list: int = 128) -> list[torch.Tensor]:
    """``npu_grouped_matmul`` weights ``[K, N]`` for ``y = x @ w.T`` plus one all-zero *sentinel* group.

    The sentinel group receives the rows of experts that are not local (its output is zero), so the group
    sizes always add up to the number of rows, as the operator requires. Up to ``max_list`` groups go as a
    list of transposed views (the "single x, multiple weight, single y" case, list length <= 128 for
    ``group_list_type=1``); more are stacked into one ``[G, K, N]`` tensor (up to 1024 groups).
    """
    mats = [plain(w, dtype).t() for w in weights]
    k, n = mats[0].shape
    mats.append(mats[0].new_zeros(k, n))
    if len(mats) <= max_list:
        return mats
    return [torch.stack(mats)]
