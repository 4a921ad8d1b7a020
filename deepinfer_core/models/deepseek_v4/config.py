"""DeepSeek-V4 model config, read from ``config.json`` in transformers' field names or DeepSeek's own.

Accepted spellings (first match wins): ``hidden_size|dim``, ``num_hidden_layers|n_layers``,
``num_attention_heads|n_heads``, ``moe_intermediate_size|moe_inter_dim``, ``num_experts_per_tok|n_activated_experts``,
``routed_scaling_factor|route_scale``, ``scoring_func|score_func``, ``sliding_window|window_size``,
``rms_norm_eps|norm_eps``, ``num_nextn_predict_layers|n_mtp_layers``, ``max_position_embeddings|max_seq_len``.
The attention schedule comes from ``layer_types`` + ``compress_rates`` (transformers) or per-layer
``compress_ratios`` (DeepSeek: 0 = sliding window, 4 = CSA, any other ratio = HCA); the MoE schedule from
``mlp_layer_types`` or ``num_hash_layers``; the compressed layers' YaRN from ``rope_parameters["compress"]``,
a flat ``rope_parameters`` / ``rope_scaling`` dict, or DeepSeek's ``rope_factor`` + ``original_seq_len``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deepinfer_core.config import ConfigError

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
HASH_MOE, MOE = "hash_moe", "moe"
SCORE_FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")
_MISSING = object()


class ModelConfigError(ConfigError):
    """config.json of a DeepSeek-V4 checkpoint is invalid; the message names the field."""


@dataclass(frozen=True)
class YarnParams:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class DeepseekV4Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    q_lora_rank: int
    qk_rope_head_dim: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    layer_types: tuple[str, ...]
    compress_ratios: tuple[int, ...]  # per layer; 0 for sliding-window layers
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    mlp_layer_types: tuple[str, ...]
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    scoring_func: str
    routed_scaling_factor: float
    swiglu_limit: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    compress_yarn: YarnParams | None
    max_position_embeddings: int
    num_nextn_predict_layers: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeepseekV4Config:
        return _parse(d)

    def overlap(self, layer: int) -> bool:
        """CSA layers compress overlapping windows (two series Ca / Cb) and own an indexer."""
        return self.layer_types[layer] == CSA


def _get(d: dict[str, Any], *names: str, default: Any = _MISSING) -> Any:
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    if default is _MISSING:
        raise ModelConfigError(f"config.json: required field {names[0]!r} is missing")
    return default


#: upper bounds on sizes and counts: far above any DeepSeek model, far below what would exhaust memory or
#: time while the model is built (config.json is untrusted input)
MAX_SIZE = 1 << 24
MAX_LOOP = 1000


def _int(
    d: dict[str, Any], *names: str, default: Any = _MISSING, minimum: int = 1, maximum: int = MAX_SIZE
) -> int:
    v = _get(d, *names, default=default)
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
        raise ModelConfigError(f"config.json: {names[0]}={v!r} must be an integer in [{minimum}, {maximum}]")
    return v


def _float(
    d: dict[str, Any],
    *names: str,
    default: Any = _MISSING,
    positive: bool = False,
    maximum: float = math.inf,
) -> float:
    """A finite number (NaN and infinities are never valid), > 0 if ``positive``, <= ``maximum``."""
    v = _get(d, *names, default=default)
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    if not ok or (positive and v <= 0) or v > maximum:
        rng = f"in ({0 if positive else '-inf'}, {maximum:g}]" if maximum < math.inf else ""
        kind = "positive " if positive else ""
        raise ModelConfigError(f"config.json: {names[0]}={v!r} must be a finite {kind}number {rng}".rstrip())
    return float(v)


def _attention_schedule(d: dict[str, Any], n: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if d.get("layer_types") is not None:
        types = list(d["layer_types"])
        rates = {CSA: 4, HCA: 128, **(d.get("compress_rates") or {})}
        rates[CSA] = d.get("compress_rate_csa") or rates[CSA]
        rates[HCA] = d.get("compress_rate_hca") or rates[HCA]
        if len(types) < n:
            raise ModelConfigError(
                f"config.json: layer_types has {len(types)} entries, num_hidden_layers is {n}"
            )
        bad = [t for t in types[:n] if t not in (SLIDING, CSA, HCA)]
        if bad:
            raise ModelConfigError(
                f"config.json: layer_types entries must be one of {(SLIDING, CSA, HCA)}, got {bad}"
            )
        for kind in (CSA, HCA):
            r = rates[kind]
            if kind in types[:n] and (
                isinstance(r, bool) or not isinstance(r, int) or not 2 <= r <= MAX_SIZE
            ):
                raise ModelConfigError(f"config.json: compress_rates[{kind!r}]={r!r} must be an integer >= 2")
        return tuple(types[:n]), tuple(0 if t == SLIDING else rates[t] for t in types[:n])
    if d.get("compress_ratios") is not None:
        return _from_compress_ratios(
            list(d["compress_ratios"]),
            n,
            _int(d, "num_nextn_predict_layers", "n_mtp_layers", default=0, minimum=0),
        )
    types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    return tuple(types), tuple(4 if t == CSA else 128 for t in types)


def _from_compress_ratios(ratios: list[Any], n: int, n_mtp: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if len(ratios) < n:
        raise ModelConfigError(
            f"config.json: compress_ratios has {len(ratios)} entries, num_hidden_layers is {n}"
        )
    for i, r in enumerate(ratios):
        if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r == 1 or r > MAX_SIZE:
            raise ModelConfigError(
                f"config.json: compress_ratios[{i}]={r!r} must be 0 (sliding window), 4 (CSA) or a ratio >= 2 (HCA)"
            )
    extra = ratios[n : n + n_mtp]
    if any(extra):
        raise ModelConfigError(
            f"config.json: compress_ratios for the MTP layers ({extra}) must be 0: MTP blocks use sliding-window attention"
        )
    kinds = tuple(SLIDING if r == 0 else CSA if r == 4 else HCA for r in ratios[:n])
    return kinds, tuple(ratios[:n])


def _mlp_schedule(d: dict[str, Any], n: int) -> tuple[str, ...]:
    if d.get("mlp_layer_types") is not None:
        types = list(d["mlp_layer_types"])
        if len(types) < n or any(t not in (HASH_MOE, MOE) for t in types[:n]):
            raise ModelConfigError(
                f"config.json: mlp_layer_types must list {n} entries from {(HASH_MOE, MOE)}, got {types}"
            )
        return tuple(types[:n])
    n_hash = _int(d, "num_hash_layers", "n_hash_layers", default=3, minimum=0)
    return tuple([HASH_MOE] * min(n, n_hash) + [MOE] * max(0, n - n_hash))


def _rope_dim(d: dict[str, Any], head_dim: int) -> int:
    prf = d.get("partial_rotary_factor")
    qk = d.get("qk_rope_head_dim", d.get("rope_head_dim"))
    if prf is not None:
        dim = int(head_dim * prf)
        if qk is not None and qk != dim:
            raise ModelConfigError(
                f"config.json: qk_rope_head_dim={qk} disagrees with partial_rotary_factor={prf} * head_dim={head_dim}"
            )
    else:
        dim = qk if qk is not None else head_dim * 64 // 512
    if not isinstance(dim, int) or dim < 2 or dim % 2 or dim > head_dim:
        raise ModelConfigError(
            f"config.json: qk_rope_head_dim={dim!r} must be even, >= 2 and <= head_dim={head_dim}"
        )
    return dim


def _compress_rope(d: dict[str, Any]) -> tuple[float, float, YarnParams | None]:
    """(main rope_theta, compress rope_theta, YaRN of the compressed layers or None)."""
    main_theta = _float(d, "rope_theta", default=10000.0, positive=True)
    cmp_theta = _float(d, "compress_rope_theta", default=160000.0, positive=True)
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        if rp["main"].get("rope_type", "default") != "default":
            raise ModelConfigError(
                "config.json: rope_parameters['main'].rope_type must be 'default' (sliding-window layers use plain RoPE)"
            )
        main_theta = _float(rp["main"], "rope_theta", default=main_theta, positive=True)
        cmp_theta = _float(rp["compress"], "rope_theta", default=cmp_theta, positive=True)
        rp = rp["compress"]
    elif d.get("rope_factor") is not None and d.get("original_seq_len"):
        rp = {
            "rope_type": "yarn",
            "factor": d["rope_factor"],
            "original_max_position_embeddings": d["original_seq_len"],
            "beta_fast": d.get("beta_fast", 32),
            "beta_slow": d.get("beta_slow", 1),
        }
    return main_theta, cmp_theta, _yarn(rp, d)


def _yarn(rp: dict[str, Any], d: dict[str, Any]) -> YarnParams | None:
    """The compressed layers' RoPE scaling: ``None`` (plain RoPE) or YaRN with ``attention_factor`` 1.0."""
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind == "default":
        return None
    if kind != "yarn":
        raise ModelConfigError(
            f"config.json: rope type {kind!r} of the compressed layers is not supported (default or yarn)"
        )
    if rp.get("attention_factor", 1.0) != 1.0:
        raise ModelConfigError(
            f"config.json: rope attention_factor={rp['attention_factor']} is not supported; V4 uses 1.0"
        )
    orig = _int(rp, "original_max_position_embeddings")
    max_pos = _float(d, "max_position_embeddings", default=orig)
    factor = _float(rp, "factor", default=max_pos / orig, positive=True)
    return YarnParams(
        factor, orig, _float(rp, "beta_fast", default=32.0), _float(rp, "beta_slow", default=1.0)
    )


def _eos(d: dict[str, Any]) -> tuple[int, ...]:
    eos = d.get("eos_token_id", 1)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
        raise ModelConfigError(
            f"config.json: eos_token_id={d.get('eos_token_id')!r} must be an integer or a list of integers"
        )
    return tuple(eos)


def _moe_fields(d: dict[str, Any], n: int) -> dict[str, Any]:
    return dict(
        mlp_layer_types=_mlp_schedule(d, n),
        n_routed_experts=_int(d, "n_routed_experts", "num_local_experts", maximum=1 << 16),
        num_experts_per_tok=_int(d, "num_experts_per_tok", "n_activated_experts"),
        n_shared_experts=_int(d, "n_shared_experts", default=1),
        moe_intermediate_size=_int(d, "moe_intermediate_size", "moe_inter_dim"),
        scoring_func=_get(d, "scoring_func", "score_func", default="sqrtsoftplus"),
        routed_scaling_factor=_float(
            d, "routed_scaling_factor", "route_scale", default=1.5, positive=True, maximum=1e3
        ),
        swiglu_limit=_float(d, "swiglu_limit", default=10.0, maximum=1e6),
    )


def _attention_fields(d: dict[str, Any], n: int) -> dict[str, Any]:
    head_dim = _int(d, "head_dim")
    types, ratios = _attention_schedule(d, n)
    main_theta, cmp_theta, yarn = _compress_rope(d)
    return dict(
        num_attention_heads=_int(d, "num_attention_heads", "n_heads"),
        head_dim=head_dim,
        q_lora_rank=_int(d, "q_lora_rank"),
        qk_rope_head_dim=_rope_dim(d, head_dim),
        o_groups=_int(d, "o_groups", default=8),
        o_lora_rank=_int(d, "o_lora_rank"),
        sliding_window=_int(d, "sliding_window", "window_size", default=128),
        layer_types=types,
        compress_ratios=ratios,
        index_n_heads=_int(d, "index_n_heads", default=64),
        index_head_dim=_int(d, "index_head_dim", default=128),
        index_topk=_int(d, "index_topk", default=512),
        rope_theta=main_theta,
        compress_rope_theta=cmp_theta,
        compress_yarn=yarn,
    )


def _parse(d: dict[str, Any]) -> DeepseekV4Config:
    n = _int(d, "num_hidden_layers", "n_layers", maximum=4096)
    cfg = DeepseekV4Config(
        vocab_size=_int(d, "vocab_size"),
        hidden_size=_int(d, "hidden_size", "dim"),
        num_hidden_layers=n,
        **_attention_fields(d, n),
        **_moe_fields(d, n),
        hc_mult=_int(d, "hc_mult", default=4, maximum=64),
        hc_sinkhorn_iters=_int(d, "hc_sinkhorn_iters", default=20, maximum=MAX_LOOP),
        hc_eps=_float(d, "hc_eps", default=1e-6, positive=True, maximum=1.0),
        rms_norm_eps=_float(d, "rms_norm_eps", "norm_eps", default=1e-6, positive=True, maximum=1.0),
        max_position_embeddings=_int(
            d, "max_position_embeddings", "max_seq_len", default=1 << 20, maximum=1 << 26
        ),
        num_nextn_predict_layers=_int(d, "num_nextn_predict_layers", "n_mtp_layers", default=1, minimum=0),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        eos_token_ids=_eos(d),
    )
    _validate(cfg, d)
    bad = [e for e in cfg.eos_token_ids if not 0 <= e < cfg.vocab_size]
    if bad:
        raise ModelConfigError(
            f"config.json: eos_token_id {bad[0]} is outside the vocabulary [0, {cfg.vocab_size})"
        )
    return cfg


def _validate(c: DeepseekV4Config, d: dict[str, Any]) -> None:
    checks = [
        (c.head_dim % 2 == 0, f"head_dim={c.head_dim} must be even"),
        (
            c.index_head_dim >= c.qk_rope_head_dim,
            f"index_head_dim={c.index_head_dim} must be >= qk_rope_head_dim={c.qk_rope_head_dim}",
        ),
        (
            (c.num_attention_heads * c.head_dim) % c.o_groups == 0,
            f"o_groups={c.o_groups} must divide num_attention_heads * head_dim",
        ),
        (
            c.num_experts_per_tok <= c.n_routed_experts,
            f"num_experts_per_tok={c.num_experts_per_tok} exceeds n_routed_experts={c.n_routed_experts}",
        ),
        (c.scoring_func in SCORE_FUNCS, f"scoring_func={c.scoring_func!r} must be one of {SCORE_FUNCS}"),
        (c.n_shared_experts == 1, f"n_shared_experts={c.n_shared_experts}: V4 has exactly one shared expert"),
        (
            d.get("num_key_value_heads", 1) == 1,
            f"num_key_value_heads={d.get('num_key_value_heads')}: V4 uses one shared KV head",
        ),
        (d.get("hidden_act", "silu") == "silu", f"hidden_act={d.get('hidden_act')!r}: V4 uses silu"),
        (
            d.get("norm_topk_prob", True) is True,
            "norm_topk_prob=false is not supported: V4 normalises the routing weights",
        ),
    ]
    for ok, msg in checks:
        if not ok:
            raise ModelConfigError(f"config.json: {msg}")
