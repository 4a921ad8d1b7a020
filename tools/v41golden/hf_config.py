"""The root ``config.json`` of a tiny checkpoint: transformers-style names, text settings in ``text_config``.

The key names inside ``text_config`` are our rendering of the published shape (V4's transformers names where V4
has the setting, the reference's names for what V4.1 adds). The authoritative values for the reference are in
``inference/config.json`` (``ModelArgs`` names); :func:`render` derives both from the same numbers, and the
golden tool checks that the two agree field by field through :data:`TEXT_TO_ARGS`.
"""

from __future__ import annotations

ARCHITECTURE = "DeepseekV41ForCausalLM"
MODEL_TYPE = "deepseek_v41"

# text_config key -> ModelArgs field (same value, except rope_scaling which gathers four fields)
TEXT_TO_ARGS = {
    "vocab_size": "vocab_size",
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_nextn_predict_layers": "n_mtp_layers",
    "num_attention_heads": "n_heads",
    "head_dim": "head_dim",
    "qk_rope_head_dim": "rope_head_dim",
    "q_lora_rank": "q_lora_rank",
    "o_groups": "o_groups",
    "o_lora_rank": "o_lora_rank",
    "sliding_window": "window_size",
    "compress_ratios": "compress_ratios",
    "kv_source_layers": "kv_source_layers",
    "index_source_layers": "index_source_layers",
    "candidate_source_layer": "candidate_source_layer",
    "candidate_topk_blocks": "candidate_topk_blocks",
    "candidate_block_size": "candidate_block_size",
    "index_n_heads": "index_n_heads",
    "index_head_dim": "index_head_dim",
    "index_topk": "index_topk",
    "n_routed_experts": "n_routed_experts",
    "n_shared_experts": "n_shared_experts",
    "num_experts_per_tok": "n_activated_experts",
    "moe_intermediate_size": "moe_inter_dim",
    "scoring_func": "score_func",
    "norm_topk_prob": "norm_topk_prob",
    "routed_scaling_factor": "route_scale",
    "swiglu_limit": "swiglu_limit",
    "hc_mult": "hc_mult",
    "hc_sinkhorn_iters": "hc_sinkhorn_iters",
    "hc_eps": "hc_eps",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
    "compress_rope_theta": "compress_rope_theta",
}
PREFIXED = ("engram_", "dspark_")  # copied under the same names


def _rope_scaling(args: dict) -> dict:
    return {
        "type": "yarn",
        "factor": args["rope_factor"],
        "original_max_position_embeddings": args["original_seq_len"],
        "beta_fast": args["beta_fast"],
        "beta_slow": args["beta_slow"],
    }


def text_config(args: dict, max_position_embeddings: int) -> dict:
    out = {k: args[v] for k, v in TEXT_TO_ARGS.items()}
    out.update({k: v for k, v in args.items() if k.startswith(PREFIXED)})
    out.update(
        model_type="deepseek_v41_text",
        num_key_value_heads=1,
        hidden_act="silu",
        topk_method="noaux_tc",
        rope_scaling=_rope_scaling(args),
        max_position_embeddings=max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    return dict(sorted(out.items()))


def vision_config(args: dict) -> dict | None:
    """The ``vision_*`` values under their reference names (None for a text-only model)."""
    if not args.get("vision_n_layers"):
        return None
    return {k: v for k, v in sorted(args.items()) if k.startswith("vision_")}


def render(args: dict, max_position_embeddings: int) -> dict:
    """The root ``config.json`` for ``ModelArgs`` values ``args`` (``vision_config`` null when text-only)."""
    extra = {"image_token_id": args["image_token_id"]} if vision_config(args) else {}
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "text_config": text_config(args, max_position_embeddings),
        "vision_config": vision_config(args),
        **extra,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [32, 32],
            "scale_fmt": "ue8m0",
            "expert_dtype": "fp4",
        },
    }
