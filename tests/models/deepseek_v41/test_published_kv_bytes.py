"""The per-token KV bytes the engine allocates for the *published* DeepSeek-V4.1-Flash config: the model built
from its ``text_config`` (no weights), its own cache specs, and the engine's KV planner. The global KV is
DeepSeek's ~890 bytes per token (``docs/models.md``, "KV bytes per token")."""

from __future__ import annotations

import torch

from deepinfer_core.kv.budget import group_block_bytes, kv_footprint, plan_kv
from deepinfer_core.models.deepseek_v41 import DeepseekV41Config, DeepseekV41ForCausalLM
from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.reference import reference_op

BACKENDS = Backends("reference", **{c: reference_op(c) for c in CONCERNS})

#: V4.1-Flash's text settings (``../shared/v41/README.md``, "Config"; ``docs/v41_reference.md``, 7)
PUBLISHED_TEXT_CONFIG = {
    "vocab_size": 129280,
    "hidden_size": 5120,
    "num_hidden_layers": 40,
    "num_nextn_predict_layers": 3,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1280,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "rms_norm_eps": 1e-20,
    "sliding_window": 128,
    "compress_ratios": [0] * 2 + [2] * 18 + [1] * 20 + [0] * 3,
    "kv_source_layers": [2, 8, 14, 20],
    "index_source_layers": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "candidate_source_layer": 20,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2304,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536},
    "max_position_embeddings": 1 << 20,
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384_006_168, 384_016_682],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_vocab_size": 99_092,
    "engram_compressed_vocab_size": 99_092,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128,
    "dspark_n_activated_experts": 3,
    "eos_token_id": 1,
}


def published_specs(kv_cache_dtype: str, dtype: torch.dtype = torch.bfloat16):
    cfg = DeepseekV41Config.from_dict(
        {"architectures": ["DeepseekV41ForCausalLM"], "text_config": PUBLISHED_TEXT_CONFIG}
    )
    model = DeepseekV41ForCausalLM(cfg, BACKENDS, dtype)  # slots only: nothing is allocated or read
    model.use_kv_cache_dtype(kv_cache_dtype)
    return model.cache_specs()


def test_published_config_allocates_890_bytes_per_token_of_global_kv():
    specs = published_specs("auto")
    kept = sorted(s.name for s in specs if s.group == "compressed")
    assert kept == sorted(
        f"layers.{i}.attn.{k}" for i in (2, 8, 14, 20) for k in ("compressor.kv", "indexer.keys")
    )
    fp = kv_footprint(specs)
    # FP4 compressed KV (256 B + 32 e4m3 scales) and FP4 index keys (64 B + 4 ue8m0), 2.5 entries per token
    assert fp.bytes_per_token == 2.5 * 288 + 2.5 * 68 == 890
    # bounded per request: 40 FP8 window rings of 128 x (512 + 16) B, three ratio-2 compressor states
    # (2 x 2 x 512 float32), the Engram look-back (4 int64 ids); the DSpark stages' rings are not allocated
    assert fp.window_bytes == 40 * 128 * 528 + 3 * 2 * 2 * 512 * 4 + 4 * 8 == 2_727_968
    for block_size in (16, 64, 256):
        assert group_block_bytes(specs, block_size)["compressed"] == 890 * block_size
    layout = plan_kv(specs, 256, 8 << 30, 65536, max_num_seqs=4, max_num_batched_tokens=8192)
    assert layout.block_bytes["compressed"] == 890 * 256


def test_published_config_unquantized_global_kv_costs_its_dtype():
    assert kv_footprint(published_specs("unquantized", torch.bfloat16)).bytes_per_token == 2.5 * 640 * 2
    assert kv_footprint(published_specs("unquantized", torch.float32)).bytes_per_token == 2.5 * 640 * 4


def test_trained_cache_is_refused_where_attention_cannot_read_packed_pools():
    """``kv_cache_dtype="auto"`` (V4.1's FP8 / FP4 pools) on a platform whose attention does not declare
    ``packed_kv``: a clear error naming the way out, before any step runs (it used to fail at the first store
    on ``cuda_sm100``), while ``"unquantized"`` still loads."""
    from dataclasses import replace

    import pytest

    class PlainPoolsOnly(type(BACKENDS.attention)):
        packed_kv = False

    backends = replace(BACKENDS, attention=PlainPoolsOnly())
    cfg = DeepseekV41Config.from_dict(
        {"architectures": ["DeepseekV41ForCausalLM"], "text_config": PUBLISHED_TEXT_CONFIG}
    )
    model = DeepseekV41ForCausalLM(cfg, backends, torch.bfloat16)
    with pytest.raises(
        ValueError, match="kv_cache_dtype='auto'.*PlainPoolsOnly.*kv_cache_dtype='unquantized'"
    ):
        model.use_kv_cache_dtype("auto")
    model.use_kv_cache_dtype("unquantized")
    assert not any(block.attn.formats.quantized for block in model.layers)
