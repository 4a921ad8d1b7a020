"""Write a transformers ``DeepseekV4ForCausalLM`` (plus optional MTP modules) in DeepSeek's published layout.

Used by the demo-model training tool and by the tests that build checkpoints; the inverse of the key
mapping the loader accepts (``layout.canonical_name``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

# transformers -> DeepSeek renames, applied in order (the reverse of transformers' conversion mapping).
_RENAMES = [
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^model\.norm\.weight$", "norm.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.layers\.", "layers."),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.(attn|ffn)_hc\.(fn|base|scale)$", r".hc_\1_\2"),
    (r"\.self_attn\.sinks$", ".attn.attn_sink"),
    (r"\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.", ".attn.indexer.weights_proj."),
    (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".attn.indexer.wq_b."),
    (r"\.self_attn\.compressor\.indexer\.", ".attn.indexer.compressor."),
    (r"\.self_attn\.", ".attn."),
    (r"\.q_a_proj\.", ".wq_a."),
    (r"\.q_a_norm\.", ".q_norm."),
    (r"\.q_b_proj\.", ".wq_b."),
    (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."),
    (r"(compressor\.)kv_proj\.", r"\1wkv."),
    (r"(compressor\.)gate_proj\.", r"\1wgate."),
    (r"(compressor\.)kv_norm\.", r"\1norm."),
    (r"(compressor\.)position_bias$", r"\1ape"),
    (r"\.attn\.kv_proj\.", ".attn.wkv."),
    (r"\.mlp\.gate\.e_score_correction_bias$", ".ffn.gate.bias"),
    (r"\.mlp\.shared_experts\.gate_proj\.", ".ffn.shared_experts.w1."),
    (r"\.mlp\.shared_experts\.down_proj\.", ".ffn.shared_experts.w2."),
    (r"\.mlp\.shared_experts\.up_proj\.", ".ffn.shared_experts.w3."),
    (r"\.mlp\.", ".ffn."),
]
SLIDING = "sliding_attention"


def deepseek_name(key: str) -> str:
    """transformers state-dict key -> DeepSeek checkpoint name (stacked experts are split separately)."""
    for pat, rep in _RENAMES:
        key = re.sub(pat, rep, key)
    return key


def to_deepseek_state(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename every tensor and split stacked experts into ``experts.{e}.w1/w3/w2.weight``."""
    out = {}
    for k, v in hf_state.items():
        name = deepseek_name(k)
        if name.endswith(".ffn.experts.gate_up_proj"):
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[name.replace("gate_up_proj", f"{e}.w1.weight")] = v[e, :inter].clone()
                out[name.replace("gate_up_proj", f"{e}.w3.weight")] = v[e, inter:].clone()
        elif name.endswith(".ffn.experts.down_proj"):
            for e in range(v.shape[0]):
                out[name.replace("down_proj", f"{e}.w2.weight")] = v[e].clone()
        else:
            out[name] = v.contiguous()
    return out


def mtp_state(
    index: int, layer_state: dict[str, torch.Tensor], extra: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """An MTP module in DeepSeek names: its transformers decoder-layer ``layer_state`` becomes ``mtp.{index}.*``
    like ``layers.N.*``; ``extra`` holds ``e_proj.weight``, ``h_proj.weight``, ``enorm.weight``, ``hnorm.weight``,
    ``norm.weight``, ``hc_head_fn``, ``hc_head_base``, ``hc_head_scale`` (already in DeepSeek names)."""
    renamed = to_deepseek_state({f"model.layers.0.{k}": v for k, v in layer_state.items()})
    out = {k.replace("layers.0.", f"mtp.{index}.", 1): v for k, v in renamed.items()}
    out.update({f"mtp.{index}.{k}": v.contiguous() for k, v in extra.items()})
    return out


def deepseek_config(hf) -> dict:
    """The config in DeepSeek's own field names (compress_ratios, num_hash_layers, rope_scaling ...)."""
    ratios = [0 if t == SLIDING else hf.compress_rates[t] for t in hf.layer_types]
    compress = hf.rope_parameters["compress"]
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": hf.vocab_size,
        "hidden_size": hf.hidden_size,
        "num_hidden_layers": hf.num_hidden_layers,
        "num_attention_heads": hf.num_attention_heads,
        "num_key_value_heads": 1,
        "head_dim": hf.head_dim,
        "q_lora_rank": hf.q_lora_rank,
        "qk_rope_head_dim": hf.qk_rope_head_dim,
        "o_groups": hf.o_groups,
        "o_lora_rank": hf.o_lora_rank,
        "sliding_window": hf.sliding_window,
        "compress_ratios": ratios + [0] * hf.num_nextn_predict_layers,
        "compress_rope_theta": compress["rope_theta"],
        "rope_theta": hf.rope_parameters["main"]["rope_theta"],
        "rope_scaling": {
            k: v
            for k, v in compress.items()
            if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")
        },
        "index_n_heads": hf.index_n_heads,
        "index_head_dim": hf.index_head_dim,
        "index_topk": hf.index_topk,
        "num_hash_layers": hf.mlp_layer_types.count("hash_moe"),
        "n_routed_experts": hf.n_routed_experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": hf.num_experts_per_tok,
        "moe_intermediate_size": hf.moe_intermediate_size,
        "scoring_func": hf.scoring_func,
        "routed_scaling_factor": hf.routed_scaling_factor,
        "swiglu_limit": hf.swiglu_limit,
        "hc_mult": hf.hc_mult,
        "hc_sinkhorn_iters": hf.hc_sinkhorn_iters,
        "hc_eps": hf.hc_eps,
        "rms_norm_eps": hf.rms_norm_eps,
        "max_position_embeddings": hf.max_position_embeddings,
        "num_nextn_predict_layers": hf.num_nextn_predict_layers,
        "eos_token_id": hf.eos_token_id,
        "bos_token_id": hf.bos_token_id,
        "tie_word_embeddings": False,
    }


def write_shards(state: dict[str, torch.Tensor], path: Path, shards: int = 1) -> dict[str, str]:
    """Round-robin ``state`` over ``shards`` files and write ``model.safetensors.index.json``; -> weight map."""
    path.mkdir(parents=True, exist_ok=True)
    for f in path.glob("*.safetensors"):
        f.unlink()
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k].contiguous() for k in part}, str(path / file))
        weight_map.update({k: file for k in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1)
    )
    return weight_map


def save_deepseek(model, path: Path, shards: int = 1, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """Write a transformers V4 ``model`` in DeepSeek's layout (``extra``: more tensors, e.g. MTP modules)."""
    state = to_deepseek_state({k: v.detach() for k, v in model.state_dict().items()})
    state.update(extra or {})
    write_shards(state, path, shards)
    (path / "config.json").write_text(json.dumps(deepseek_config(model.config), indent=1))
    return path
