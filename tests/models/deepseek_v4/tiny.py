"""Tiny DeepSeek-V4 checkpoints for tests: a transformers model with peaky random weights, saved with
``save_pretrained`` and converted to DeepSeek's published layout by an independent rename table."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"


@dataclass(frozen=True)
class Schedule:
    name: str
    layer_types: tuple[str, ...]
    hc_mult: int = 2
    num_hash_layers: int = 1
    csa_rate: int = 4
    hca_rate: int = 16
    sliding_window: int = 8
    index_topk: int = 4
    extra: dict = field(default_factory=dict)

    def hf_config(self) -> DeepseekV4Config:
        n = len(self.layer_types)
        kw = dict(
            vocab_size=320,
            hidden_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=n,
            num_attention_heads=4,
            head_dim=32,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            num_experts_per_tok=2,
            n_routed_experts=8,
            layer_types=list(self.layer_types),
            hc_mult=self.hc_mult,
            hc_sinkhorn_iters=6,
            compress_rates={CSA: self.csa_rate, HCA: self.hca_rate},
            mlp_layer_types=["hash_moe"] * self.num_hash_layers + ["moe"] * (n - self.num_hash_layers),
            sliding_window=self.sliding_window,
            o_groups=2,
            o_lora_rank=16,
            index_n_heads=16,  # >= 16: with 8, ReLU-zero ties in the indexer top-k appear
            index_head_dim=16,
            index_topk=self.index_topk,
            max_position_embeddings=512,
            swiglu_limit=2.0,
            routed_scaling_factor=1.5,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
            },
            eos_token_id=1,
        )
        kw.update(self.extra)
        return DeepseekV4Config(**kw)


def _normal_(t: torch.Tensor, std: float, g: torch.Generator, mean: float = 0.0) -> None:
    t.copy_(torch.randn(t.shape, generator=g) * std + mean)


@torch.no_grad()
def peaky_init(model: torch.nn.Module, seed: int, cfg: DeepseekV4Config | None = None) -> None:
    """Weights large enough that every layer matters and logits have std ~1-2 (default init is too flat)."""
    g = torch.Generator().manual_seed(seed)
    cfg = cfg or model.config
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("embed_tokens.weight"):
            _normal_(p, 1.0, g)
        elif name == "lm_head.weight":
            _normal_(p, 0.25, g)
        elif "norm" in name:
            _normal_(p, 0.1, g, mean=1.0)
        elif leaf == "sinks" or leaf == "position_bias":
            _normal_(p, 0.5, g)
        elif leaf in ("fn", "hc_fn"):
            _normal_(p, 0.05, g)
        elif leaf in ("base", "hc_base"):
            _normal_(p, 0.3, g)
        elif leaf in ("scale", "hc_scale"):
            _normal_(p, 0.1, g, mean=1.0)
        elif p.dim() >= 2:
            _normal_(p, p.shape[-1] ** -0.5, g)
        else:
            _normal_(p, 0.1, g)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            _normal_(b, 0.1, g)
        elif name.endswith("tid2eid"):
            b.copy_(
                torch.stack(
                    [
                        torch.randperm(cfg.n_routed_experts, generator=g)[: cfg.num_experts_per_tok]
                        for _ in range(cfg.vocab_size)
                    ]
                )
            )


def build_hf(schedule: Schedule, seed: int = 0) -> DeepseekV4ForCausalLM:
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(schedule.hf_config()).eval()
    peaky_init(model, seed)
    return model


def save_transformers(model: DeepseekV4ForCausalLM, path: Path) -> Path:
    model.save_pretrained(path)
    return path


# transformers -> DeepSeek renames, applied in order (the reverse of transformers' conversion_mapping).
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


def deepseek_name(key: str) -> str:
    for pat, rep in _RENAMES:
        key = re.sub(pat, rep, key)
    return key


def to_deepseek_state(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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


def deepseek_config(hf: DeepseekV4Config) -> dict:
    """The config in DeepSeek's own field names (compress_ratios, num_hash_layers, rope_scaling ...)."""
    ratios = [0 if t == SWA else hf.compress_rates[t] for t in hf.layer_types]
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
        "compress_rope_theta": hf.rope_parameters["compress"]["rope_theta"],
        "rope_theta": hf.rope_parameters["main"]["rope_theta"],
        "rope_scaling": {
            k: v
            for k, v in hf.rope_parameters["compress"].items()
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


def save_deepseek(
    model: DeepseekV4ForCausalLM, path: Path, shards: int = 2, extra: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write ``model`` in DeepSeek's layout, ``shards`` safetensors files plus the index (``extra``: more tensors)."""
    state = to_deepseek_state({k: v.detach() for k, v in model.state_dict().items()})
    state.update(extra or {})
    write_shards(state, path, shards)
    (path / "config.json").write_text(json.dumps(deepseek_config(model.config)))
    return path


def write_shards(state: dict[str, torch.Tensor], path: Path, shards: int = 2) -> dict[str, str]:
    """Round-robin ``state`` over ``shards`` files, write ``model.safetensors.index.json``; -> weight map."""
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
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def read_state(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def reference_backends():
    from deepinfer_core.ops.backends import CONCERNS, Backends
    from deepinfer_core.plugins.registry import reference_op

    return Backends("reference", **{c: reference_op(c) for c in CONCERNS})


def full_logits(model, ids: list[int], block_size: int | None = None, seed: int = 0) -> torch.Tensor:
    """Logits of every position of ``ids`` from one forward over fresh paged pools."""
    from deepinfer_core.testing.kv_harness import PagedKVHarness

    h = PagedKVHarness(
        model.cache_specs(), block_size=block_size, num_blocks=2 * len(ids) // 4 + 8, seed=seed
    )
    s = h.add_sequence()
    batch = h.step({s: list(ids)}, logits="all")
    return model.compute_logits(model.forward(batch, h.pools))


def tokens(n: int, seed: int, vocab: int = 320) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
