"""Layer-owned weight loading: quantized slots stay quantized, ``wo_a`` is split per output group."""

from __future__ import annotations

import torch

from deepinfer_core.models.deepseek_v4.attention import Attention
from deepinfer_core.models.deepseek_v4.config import SLIDING, DeepseekV4Config
from deepinfer_core.models.deepseek_v4.params import Slot
from deepinfer_core.ops.quant_formats import dequant, quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.weights import QuantizedWeight

from .conftest import SCHEDULES


def _attention(o_lora_rank: int) -> Attention:
    d = SCHEDULES["swa_csa_hca_hc2"].hf_config().to_dict()
    d["o_lora_rank"] = o_lora_rank
    return Attention(DeepseekV4Config.from_dict(d), SLIDING, 0, "layers.0.attn", torch.float32)


def test_wo_a_keeps_fp8_groups_on_scale_block_boundaries():
    attn = _attention(128)
    w = torch.randn(2 * 128, 64)
    q = quantize_fp8_block(w, "ue8m0")
    attn.wo_a.weight_loader(q.data, q.scale.to(torch.float8_e8m0fnu), torch.float32, torch.device("cpu"))
    groups = attn.wo_a.value
    assert len(groups) == 2 and all(isinstance(g, QuantizedWeight) and g.shape == (128, 64) for g in groups)
    full = dequant(q)
    assert torch.equal(dequant(groups[1]), full[128:])


def test_wo_a_groups_off_block_boundaries_are_dequantized_once():
    attn = _attention(16)
    q = quantize_fp8_block(torch.randn(32, 64))
    attn.wo_a.weight_loader(q.data, q.scale, torch.float32, torch.device("cpu"))
    groups = attn.wo_a.value
    assert all(isinstance(g, torch.Tensor) and g.shape == (16, 64) for g in groups)
    assert torch.equal(torch.cat(groups), dequant(q))


def test_linear_slot_formats():
    s = Slot("w.weight", (8, 64), "linear")
    q = quantize_fp4_e2m1(torch.randn(8, 64))
    s.weight_loader(
        q.data.view(torch.float4_e2m1fn_x2),
        q.scale.to(torch.float8_e8m0fnu),
        torch.float32,
        torch.device("cpu"),
    )
    assert (
        s.value.format == "fp4_e2m1"
        and s.value.data.dtype == torch.uint8
        and s.value.scale.dtype == torch.float32
    )
    s.weight_loader(torch.randn(8, 64, dtype=torch.bfloat16), None, torch.float32, torch.device("cpu"))
    assert s.value.dtype == torch.float32
    n = Slot("norm.weight", (8,), "float32")
    n.weight_loader(torch.ones(8, dtype=torch.bfloat16), None, torch.bfloat16, torch.device("cpu"))
    assert n.value.dtype == torch.float32  # V4 keeps norms, mHC parameters and sinks in float32
