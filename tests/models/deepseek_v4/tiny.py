"""Tiny DeepSeek-V4 checkpoints for tests: a transformers model with peaky random weights, saved with
``save_pretrained`` and converted to DeepSeek's published layout by an independent rename table."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

from deepinfer_core.models.deepseek_v4 import export

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


# The DeepSeek-layout writer lives in the package (the demo-model tool uses it too); the tests write two
# shards by default so the sharded-index path is always exercised.
def save_deepseek(
    model: DeepseekV4ForCausalLM, path: Path, shards: int = 2, extra: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write ``model`` in DeepSeek's layout, ``shards`` safetensors files plus the index (``extra``: more tensors)."""
    return export.save_deepseek(model, path, shards, extra)


def write_shards(state: dict[str, torch.Tensor], path: Path, shards: int = 2) -> dict[str, str]:
    """Round-robin ``state`` over ``shards`` files, write ``model.safetensors.index.json``; -> weight map."""
    return export.write_shards(state, path, shards)


deepseek_name = export.deepseek_name
to_deepseek_state = export.to_deepseek_state
deepseek_config = export.deepseek_config


def read_state(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def reference_backends():
    from deepinfer_core.ops.backends import CONCERNS, Backends
    from deepinfer_core.ops.reference import reference_op

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
