"""FP8 (128x128 block scales, float or ue8m0) and FP4 e2m1 expert checkpoints in DeepSeek's published format.

The model keeps the weights quantized and its reference linear dequantizes them block by block, so it must
give the logits of the same model loaded from the *dequantized* weights (``dequantize_checkpoint`` applies
the identical dequantization): both compute with bit-identical weight values through the same row-wise
ops, hence bit-identical logits, and the comparison is exact. Against the original float weights only a
loose sanity bound holds (FP8 / FP4 rounding compounds over the layers of this peaky test model)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from deepinfer_core.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer_core.models.deepseek_v4.convert import dequantize_checkpoint, quantize_checkpoint
from deepinfer_core.ops.weights import QuantizedWeight

from .tiny import full_logits, tokens

SCHEDULE = "swa_csa_hca_hc2"


def _dtypes(path) -> dict[str, torch.dtype]:
    out = {}
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_slice(k).get_dtype() for k in h.keys()})
    return out


@pytest.mark.parametrize("experts,scale_fmt", [("fp8", "ue8m0"), ("fp4", None), ("fp4", "ue8m0")])
def test_quantized_checkpoint_matches_its_dequantized_weights(
    checkpoints, backends, tmp_path, experts, scale_fmt
):
    src = checkpoints.path(SCHEDULE, "transformers")
    q = quantize_checkpoint(src, tmp_path / "q", experts=experts, scale_fmt=scale_fmt, shard_bytes=150_000)
    dq = dequantize_checkpoint(q, tmp_path / "dq")

    dtypes = _dtypes(q)
    assert len(list(q.glob("*.safetensors"))) > 1 and (q / "model.safetensors.index.json").is_file()
    assert dtypes["layers.1.attn.wq_a.weight"] == "F8_E4M3"
    assert dtypes["layers.1.attn.wq_a.scale"] == ("F8_E8M0" if scale_fmt == "ue8m0" else "F32")
    assert dtypes["layers.1.ffn.experts.3.w2.weight"] == ("F4" if experts == "fp4" else "F8_E4M3")
    assert (
        dtypes["layers.1.attn.compressor.wkv.weight"] == "F32"
        and "layers.1.attn.compressor.wkv.scale" not in dtypes
    )
    config = json.loads((q / "config.json").read_text())
    assert config["quantization_config"]["scale_fmt"] == scale_fmt and config.get("expert_dtype") == (
        "fp4" if experts == "fp4" else None
    )

    model = DeepseekV4ForCausalLM.from_checkpoint(q, backends, torch.float32)
    assert model.layout == "deepseek"
    wq_a, w2 = model.layers[1].attn.wq_a.value, model.layers[1].ffn.experts[3].w2.value
    assert (
        isinstance(wq_a, QuantizedWeight)
        and wq_a.format == "fp8_block"
        and wq_a.data.dtype == torch.float8_e4m3fn
    )
    assert isinstance(w2, QuantizedWeight) and w2.format == ("fp4_e2m1" if experts == "fp4" else "fp8_block")

    ids = tokens(64, seed=5)
    got = full_logits(model, ids)
    want = full_logits(DeepseekV4ForCausalLM.from_checkpoint(dq, backends, torch.float32), ids)
    # the same function of the same float32 weights; not always the same bits: on some CPUs the GEMM kernels
    # round the quantized model's freshly dequantized matrices and the loaded ones differently (4.9e-6 seen)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    original = full_logits(DeepseekV4ForCausalLM.from_checkpoint(src, backends, torch.float32), ids)
    assert (got - original).abs().median() < 0.6, "quantized model drifted far from the float model"
