"""DeepSeek-V4.1 model config, read from the published ``config.json``: transformers-style names with the
text settings nested in ``text_config`` (a flat file, or DeepSeek's ``inference/config.json`` names, also
load: the same aliases as V4's config).

V4.1's additions keep DeepSeek's names: ``compress_ratios`` (one per layer, DSpark stages included, 0 for
them), ``kv_source_layers``, ``index_source_layers``, ``candidate_source_layer`` / ``_topk_blocks`` /
``_block_size``, ``engram_*`` and ``dspark_*``. The compressed layers' YaRN comes from ``rope_scaling``
(``factor``, ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``) or DeepSeek's
``rope_factor`` + ``original_seq_len``. The layer roles (:mod:`.roles`) are checked here too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from deepinfer_core.models.deepseek_v4.config import (
    MAX_LOOP,
    ModelConfigError,
    YarnParams,
    _float,
    _get,
    _int,
)
from deepinfer_core.models.deepseek_v41.roles import LayerRole, layer_roles
from deepinfer_core.models.deepseek_v41.vision.config import VisionConfig

__all__ = ["DeepseekV41Config", "EngramConfig", "ModelConfigError", "read_text_config"]


@dataclass(frozen=True)
class EngramConfig:
    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]  # table rows per Engram layer
    max_ngram_size: int
    vocab_size: int  # where each (n-gram size, head) starts its prime search
    n_heads: int
    head_dim: int
    pad_id: int
    compressed_vocab_size: int

    @property
    def n_cols(self) -> int:
        """Hash columns per token and layer: ``(max_ngram_size - 1) * n_heads``."""
        return (self.max_ngram_size - 1) * self.n_heads


@dataclass(frozen=True)
class DeepseekV41Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_nextn_predict_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratios: tuple[int, ...]  # backbone layers, then the DSpark stages (all 0)
    kv_source_layers: tuple[int, ...]
    index_source_layers: tuple[int, ...]
    candidate_source_layer: int  # -1: no candidate pool
    candidate_topk_blocks: int
    candidate_block_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    swiglu_limit: float
    gate_temp: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    compress_yarn: YarnParams | None
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    engram: EngramConfig | None
    dspark: dict[str, Any]  # dspark_* settings without the prefix (read by .dspark.DSparkConfig)
    #: the vision tower (``vision_config`` or flat ``vision_*`` keys); None: a text-only checkpoint
    vision: VisionConfig | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeepseekV41Config:
        return replace(_parse(read_text_config(d)), vision=VisionConfig.from_dict(d))

    @property
    def roles(self) -> tuple[LayerRole, ...]:
        """Every backbone layer's role (SWA, Full, Reindex, Reuse) and the sources it reads."""
        return layer_roles(self)


def read_text_config(d: dict[str, Any]) -> dict[str, Any]:
    """The text settings: ``text_config`` when the file nests them, else the file itself."""
    text = d.get("text_config")
    if text is None:
        return d
    if not isinstance(text, dict):
        raise ModelConfigError("config.json: text_config must be an object")
    return {"eos_token_id": d.get("eos_token_id"), **text}


def _ints(d: dict[str, Any], name: str, default: Any = None) -> tuple[int, ...]:
    v = d.get(name, default)
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ModelConfigError(f"config.json: {name}={v!r} must be a list of integers")
    return tuple(v)


def _yarn(d: dict[str, Any]) -> YarnParams | None:
    rs = d.get("rope_scaling") or {}
    if not rs and d.get("original_seq_len"):
        rs = {
            "type": "yarn",
            "factor": d.get("rope_factor", 1.0),
            "original_max_position_embeddings": d["original_seq_len"],
            "beta_fast": d.get("beta_fast", 32),
            "beta_slow": d.get("beta_slow", 1),
        }
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return None
    if kind != "yarn":
        raise ModelConfigError(f"config.json: rope_scaling type {kind!r} is not supported (default or yarn)")
    return YarnParams(
        _float(rs, "factor", positive=True),
        _int(rs, "original_max_position_embeddings"),
        _float(rs, "beta_fast", default=32.0),
        _float(rs, "beta_slow", default=1.0),
    )


def _engram(d: dict[str, Any]) -> EngramConfig | None:
    layers = _ints(d, "engram_layer_ids", ())
    if not layers:
        return None
    e = EngramConfig(
        layer_ids=layers,
        num_embeddings=_ints(d, "engram_num_embeddings"),
        max_ngram_size=_int(d, "engram_max_ngram_size", minimum=2, maximum=64),
        vocab_size=_int(d, "engram_vocab_size", minimum=2),
        n_heads=_int(d, "engram_n_heads", maximum=MAX_LOOP),
        head_dim=_int(d, "engram_head_dim"),
        pad_id=_int(d, "engram_pad_id", default=2, minimum=0),
        compressed_vocab_size=_int(d, "engram_compressed_vocab_size"),
    )
    if len(e.num_embeddings) != len(layers) or e.head_dim % 32:
        raise ModelConfigError(
            "config.json: engram_num_embeddings needs one entry per engram layer and engram_head_dim must be "
            "a multiple of 32 (one scale per 32 channels)"
        )
    return e


def _attention(d: dict[str, Any], n: int, n_mtp: int) -> dict[str, Any]:
    ratios = _ints(d, "compress_ratios")
    if len(ratios) < n + n_mtp or any(r not in (0, 1, 2) for r in ratios[: n + n_mtp]):
        raise ModelConfigError(
            f"config.json: compress_ratios={list(ratios)} must list {n + n_mtp} ratios (layers, then DSpark "
            "stages), each 0, 1 or 2"
        )
    return dict(
        num_attention_heads=_int(d, "num_attention_heads", "n_heads"),
        head_dim=_int(d, "head_dim"),
        qk_rope_head_dim=_int(d, "qk_rope_head_dim", "rope_head_dim"),
        q_lora_rank=_int(d, "q_lora_rank"),
        o_groups=_int(d, "o_groups"),
        o_lora_rank=_int(d, "o_lora_rank"),
        sliding_window=_int(d, "sliding_window", "window_size"),
        compress_ratios=ratios[: n + n_mtp],
        kv_source_layers=_ints(d, "kv_source_layers", ()),
        index_source_layers=_ints(d, "index_source_layers", ()),
        candidate_source_layer=_int(d, "candidate_source_layer", default=-1, minimum=-1),
        candidate_topk_blocks=_int(d, "candidate_topk_blocks", default=0, minimum=0),
        candidate_block_size=_int(d, "candidate_block_size", default=0, minimum=0),
        index_n_heads=_int(d, "index_n_heads"),
        index_head_dim=_int(d, "index_head_dim"),
        index_topk=_int(d, "index_topk"),
        rope_theta=_float(d, "rope_theta", default=10000.0, positive=True),
        compress_rope_theta=_float(d, "compress_rope_theta", default=160000.0, positive=True),
        compress_yarn=_yarn(d),
    )


def _moe(d: dict[str, Any]) -> dict[str, Any]:
    if _get(d, "scoring_func", "score_func", default="sqrtsoftplus") != "sqrtsoftplus":
        raise ModelConfigError("config.json: scoring_func must be 'sqrtsoftplus' (V4.1's router)")
    if d.get("norm_topk_prob", True) is not True or _int(d, "n_shared_experts", default=1) != 1:
        raise ModelConfigError("config.json: V4.1 needs norm_topk_prob true and exactly one shared expert")
    if d.get("topk_method", "noaux_tc") != "noaux_tc":
        raise ModelConfigError(f"config.json: topk_method={d.get('topk_method')!r}; V4.1 routes by noaux_tc")
    return dict(
        n_routed_experts=_int(d, "n_routed_experts", maximum=1 << 16),
        num_experts_per_tok=_int(d, "num_experts_per_tok", "n_activated_experts", minimum=2),
        moe_intermediate_size=_int(d, "moe_intermediate_size", "moe_inter_dim"),
        routed_scaling_factor=_float(d, "routed_scaling_factor", "route_scale", positive=True, maximum=1e3),
        swiglu_limit=_float(d, "swiglu_limit", default=0.0, maximum=1e6),
        gate_temp=_float(d, "gate_temp", default=1.0, positive=True),
    )


def _eos(d: dict[str, Any], vocab: int) -> tuple[int, ...]:
    eos = d.get("eos_token_id", 1)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < vocab for e in eos):
        raise ModelConfigError(f"config.json: eos_token_id={eos!r} must be token ids below {vocab}")
    return tuple(eos)


def _parse(d: dict[str, Any]) -> DeepseekV41Config:
    n = _int(d, "num_hidden_layers", "n_layers", maximum=4096)
    n_mtp = _int(d, "num_nextn_predict_layers", "n_mtp_layers", default=0, minimum=0, maximum=64)
    vocab = _int(d, "vocab_size")
    cfg = DeepseekV41Config(
        vocab_size=vocab,
        hidden_size=_int(d, "hidden_size", "dim"),
        num_hidden_layers=n,
        num_nextn_predict_layers=n_mtp,
        **_attention(d, n, n_mtp),
        **_moe(d),
        hc_mult=_int(d, "hc_mult", default=4, maximum=64),
        hc_sinkhorn_iters=_int(d, "hc_sinkhorn_iters", default=20, maximum=MAX_LOOP),
        hc_eps=_float(d, "hc_eps", default=1e-6, positive=True, maximum=1.0),
        rms_norm_eps=_float(d, "rms_norm_eps", "norm_eps", default=1e-20, positive=True, maximum=1.0),
        max_position_embeddings=_int(d, "max_position_embeddings", "max_seq_len", maximum=1 << 26),
        eos_token_ids=_eos(d, vocab),
        engram=_engram(d),
        dspark={k[len("dspark_") :]: v for k, v in d.items() if k.startswith("dspark_")},
    )
    _check_shapes(cfg, d)
    layer_roles(cfg)  # raises on roles the reference could not run
    return cfg


def _check_shapes(c: DeepseekV41Config, d: dict[str, Any]) -> None:
    """Sizes the quantised GEMMs, the KV formats and the RoPE tail need."""
    checks = [
        (c.head_dim % 32 == 0, f"head_dim={c.head_dim} must be a multiple of 32 (FP8 window KV blocks)"),
        (c.index_head_dim % 32 == 0, f"index_head_dim={c.index_head_dim} must be a multiple of 32"),
        (
            c.qk_rope_head_dim % 2 == 0 and c.qk_rope_head_dim <= min(c.head_dim, c.index_head_dim),
            f"qk_rope_head_dim={c.qk_rope_head_dim} must be even and fit head_dim and index_head_dim",
        ),
        (
            (c.num_attention_heads * c.head_dim) % c.o_groups == 0,
            f"o_groups={c.o_groups} must divide num_attention_heads * head_dim",
        ),
        (
            c.num_experts_per_tok <= c.n_routed_experts,
            f"num_experts_per_tok={c.num_experts_per_tok} exceeds n_routed_experts={c.n_routed_experts}",
        ),
        (d.get("num_key_value_heads", 1) == 1, "num_key_value_heads must be 1 (one shared K=V head)"),
        (d.get("hidden_act", "silu") == "silu", f"hidden_act={d.get('hidden_act')!r}: V4.1 uses silu"),
        (
            not d.get("tie_word_embeddings", False),
            "tie_word_embeddings must be false (V4.1 has its own head)",
        ),
    ]
    for ok, msg in checks:
        if not ok:
            raise ModelConfigError(f"config.json: {msg}")
