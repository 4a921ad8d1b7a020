"""config.json in transformers' field names, DeepSeek's HF names and DeepSeek's inference names all parse
to the same model config."""

from __future__ import annotations

import pytest

from deepinfer_core.models.deepseek_v4.config import (
    CSA,
    HASH_MOE,
    HCA,
    MOE,
    SLIDING,
    DeepseekV4Config,
    ModelConfigError,
)

from .conftest import SCHEDULES
from .tiny import deepseek_config


def _hf_dict(schedule: str) -> dict:
    return SCHEDULES[schedule].hf_config().to_dict()


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_transformers_and_deepseek_configs_agree(schedule):
    hf = SCHEDULES[schedule].hf_config()
    a = DeepseekV4Config.from_dict(hf.to_dict())
    b = DeepseekV4Config.from_dict(deepseek_config(hf))
    assert a == b
    assert a.layer_types == tuple(hf.layer_types) and a.qk_rope_head_dim == 8
    assert a.compress_yarn is not None and a.compress_yarn.factor == 8.0


def test_deepseek_inference_field_names():
    c = DeepseekV4Config.from_dict(
        {
            "vocab_size": 100,
            "dim": 64,
            "n_layers": 3,
            "n_heads": 4,
            "head_dim": 32,
            "q_lora_rank": 16,
            "rope_head_dim": 8,
            "o_lora_rank": 8,
            "o_groups": 2,
            "window_size": 16,
            "compress_ratios": [0, 4, 128, 0],
            "n_routed_experts": 8,
            "n_activated_experts": 2,
            "moe_inter_dim": 32,
            "route_scale": 2.5,
            "score_func": "sigmoid",
            "n_hash_layers": 1,
            "norm_eps": 1e-5,
            "rope_factor": 16,
            "original_seq_len": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "n_mtp_layers": 1,
            "swiglu_limit": 7.0,
            "index_head_dim": 16,
        }
    )
    assert (c.hidden_size, c.num_hidden_layers, c.sliding_window, c.qk_rope_head_dim) == (64, 3, 16, 8)
    assert c.layer_types == (SLIDING, CSA, HCA) and c.compress_ratios == (0, 4, 128)
    assert (
        c.mlp_layer_types == (HASH_MOE, MOE, MOE)
        and c.routed_scaling_factor == 2.5
        and c.scoring_func == "sigmoid"
    )
    assert c.compress_yarn.factor == 16 and c.compress_yarn.original_max_position_embeddings == 4096


def test_compress_ratios_other_than_four_are_hca():
    d = _hf_dict("swa_csa_hca_hc2")
    d.pop("layer_types")
    d["compress_ratios"] = [0, 4, 16, 64, 0]
    d["num_hidden_layers"] = 4
    c = DeepseekV4Config.from_dict(d)
    assert c.layer_types == (SLIDING, CSA, HCA, HCA) and c.compress_ratios == (0, 4, 16, 64)
    assert [c.overlap(i) for i in range(4)] == [False, True, False, False]


def test_legacy_scalar_compress_rates_and_default_schedules():
    d = _hf_dict("swa_csa_hca_hc2")
    d.update(compress_rates=None, compress_rate_hca=32)
    d.pop("mlp_layer_types")
    c = DeepseekV4Config.from_dict(d)
    assert c.compress_ratios == (0, 4, 32, 4)
    assert c.mlp_layer_types == (HASH_MOE, HASH_MOE, HASH_MOE, MOE)  # transformers' default: 3 hash layers


def test_mtp_layers_must_be_sliding_window():
    d = deepseek_config(SCHEDULES["swa_csa_hca_hc2"].hf_config())
    d["compress_ratios"][-1] = 4
    with pytest.raises(ModelConfigError, match="MTP"):
        DeepseekV4Config.from_dict(d)


def test_qk_rope_head_dim_must_agree_with_partial_rotary_factor():
    d = _hf_dict("swa_csa_hca_hc2")
    d["qk_rope_head_dim"] = 16
    with pytest.raises(ModelConfigError, match="partial_rotary_factor"):
        DeepseekV4Config.from_dict(d)


def test_yarn_attention_factor_other_than_one_is_rejected():
    d = deepseek_config(SCHEDULES["swa_csa_hca_hc2"].hf_config())
    d["rope_scaling"]["attention_factor"] = 1.3
    with pytest.raises(ModelConfigError, match="attention_factor"):
        DeepseekV4Config.from_dict(d)
