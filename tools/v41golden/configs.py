"""The tiny V4.1 configurations the goldens are written for, and what each one covers.

A :class:`TinySpec` is our own description of one tiny model. ``model_args`` renders it in the reference's
``ModelArgs`` field names (what ``inference/config.json`` holds); :mod:`v41golden.hf_config` renders the
transformers-style root ``config.json``. Shape rules the reference imposes on any config (each checked by
:func:`check`):

- every input of an FP8/FP4 GEMM is quantised per 32 values, so ``dim``, ``q_lora_rank``, ``head_dim``,
  ``index_head_dim``, ``moe_inter_dim``, ``o_groups * o_lora_rank`` and ``engram_head_dim`` are multiples of 32;
- a Reuse or Reindex layer reads the KV / index keys / top-k of the last source before it, so its ratio must be
  that source's ratio, and the candidate consumers (index sources after ``candidate_source_layer``) share the
  candidate source's ratio;
- the candidate pool must always hold ``index_topk`` reachable positions, ``(candidate_topk_blocks - 1) *
  candidate_block_size + 1 >= index_topk``; otherwise the indexer's top-k takes ``-inf`` positions outside the
  pool in an order the implementation chooses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TinySpec:
    name: str
    covers: str
    seed: int
    n_layers: int
    compress_ratios: tuple[int, ...]  # backbone layers only; the DSpark stages append zeros
    kv_source_layers: tuple[int, ...]
    index_source_layers: tuple[int, ...]
    dim: int = 32
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    n_heads: int = 4
    head_dim: int = 32
    rope_head_dim: int = 8
    q_lora_rank: int = 32
    o_groups: int = 2
    o_lora_rank: int = 16
    window_size: int = 16
    index_n_heads: int = 16
    index_head_dim: int = 32
    index_topk: int = 8
    candidate: tuple[int, int, int] = (-1, 0, 0)  # source layer, topk blocks, block size
    n_routed_experts: int = 8
    n_activated_experts: int = 3
    moe_inter_dim: int = 32
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    rope: dict = field(default_factory=dict)  # ModelArgs rope fields that differ from the defaults below
    engram: dict = field(default_factory=dict)  # engram_* fields without the prefix; empty: no Engram
    dspark: dict = field(default_factory=dict)  # dspark_* fields without the prefix plus n_mtp_layers
    prompt_lengths: tuple[int, ...] = (1, 2, 3, 4, 5, 8, 17, 33, 64, 129, 300)
    greedy_tokens: int = 16
    dspark_steps: int = 3


ROPE = dict(
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_factor=16.0,
    original_seq_len=65536,
    beta_fast=32,
    beta_slow=1,
)
MAX_SEQ_LEN = 512
NOISE_TOKEN = "<｜dspark▁noise｜>"

SPECS = (
    TinySpec(
        name="flash_mini",
        covers="the published layer pattern scaled down: SWA prefix, ratio-2 Full+Reuse groups, the ratio-1 "
        "global KV source that is also the candidate source (encoder-decoder boundary), Reuse and Reindex "
        "decoder layers in the candidate pool, Engram at an SWA and a Full layer, 3 DSpark stages, mHC x4",
        seed=41,
        n_layers=9,
        compress_ratios=(0, 2, 2, 2, 2, 1, 1, 1, 1),
        kv_source_layers=(1, 3, 5),
        index_source_layers=(1, 3, 5, 7),
        candidate=(5, 3, 4),
        n_routed_experts=6,
        engram=dict(layer_ids=(0, 3), max_ngram_size=4, n_heads=2, head_dim=32, vocab_size=40),
        dspark=dict(
            n_mtp_layers=3,
            block_size=5,
            target_layer_ids=(6, 7, 8),
            markov_rank=32,
            n_routed_experts=4,
            n_activated_experts=2,
        ),
    ),
    TinySpec(
        name="reindex_r2",
        covers="ratio-1 Full first layer with Reuse and Reindex, then a ratio-2 Full/Reuse/Reindex group, "
        "an SWA last layer, no candidate pool, mHC x2, 2-gram Engram on layer 0, top-1 MoE in a single DSpark "
        "stage (weights not renormalised), a tight swiglu_limit, YaRN over a short original context",
        seed=42,
        n_layers=7,
        compress_ratios=(1, 1, 1, 2, 2, 2, 0),
        kv_source_layers=(0, 3),
        index_source_layers=(0, 2, 3, 5),
        hc_mult=2,
        dim=64,
        window_size=8,
        index_topk=4,
        n_activated_experts=2,
        n_routed_experts=4,
        route_scale=2.5,
        swiglu_limit=0.5,
        rope=dict(rope_factor=8.0, original_seq_len=64),
        engram=dict(layer_ids=(0,), max_ngram_size=2, n_heads=3, head_dim=32, vocab_size=61),
        dspark=dict(
            n_mtp_layers=1,
            block_size=4,
            target_layer_ids=(2, 6),
            markov_rank=32,
            n_routed_experts=4,
            n_activated_experts=1,
        ),
        prompt_lengths=(1, 2, 7, 8, 9, 30, 65, 200),
    ),
    TinySpec(
        name="long_pool",
        covers="long prompts over a 32-token window: 32 indexer heads, a candidate pool of 4 blocks of 8 with "
        "two Reindex layers and a Reuse layer inside it, two ratio-2 Full layers back to back, 4-gram Engram "
        "with 4 heads on a ratio-2 Full layer, 2 DSpark stages of block 3, mHC x4",
        seed=43,
        n_layers=8,
        compress_ratios=(0, 2, 2, 2, 1, 1, 1, 1),
        kv_source_layers=(1, 3, 4),
        index_source_layers=(1, 3, 4, 5, 7),
        window_size=32,
        index_n_heads=32,
        index_topk=16,
        candidate=(4, 4, 8),
        n_routed_experts=6,
        engram=dict(layer_ids=(3,), max_ngram_size=4, n_heads=4, head_dim=32, vocab_size=29),
        dspark=dict(
            n_mtp_layers=2,
            block_size=3,
            target_layer_ids=(5, 7),
            markov_rank=32,
            n_routed_experts=4,
            n_activated_experts=2,
        ),
        prompt_lengths=(1, 31, 32, 33, 64, 65, 257, 450),
    ),
)


def by_name(name: str) -> TinySpec:
    for s in SPECS:
        if s.name == name:
            return s
    raise KeyError(f"no tiny V4.1 config {name!r}; known: {[s.name for s in SPECS]}")


def n_mtp(spec: TinySpec) -> int:
    return spec.dspark.get("n_mtp_layers", 0)


def model_args(
    spec: TinySpec, vocab_size: int, engram_rows: tuple[int, ...], compressed_vocab: int, noise_token_id: int
) -> dict:
    """``inference/config.json``: the reference's ``ModelArgs`` fields (runtime limits excluded)."""
    src, topk_blocks, block = spec.candidate
    d = dict(
        dtype="fp8",
        expert_dtype="fp4",
        vocab_size=vocab_size,
        dim=spec.dim,
        moe_inter_dim=spec.moe_inter_dim,
        n_layers=spec.n_layers,
        n_mtp_layers=n_mtp(spec),
        n_heads=spec.n_heads,
        n_routed_experts=spec.n_routed_experts,
        n_shared_experts=1,
        n_activated_experts=spec.n_activated_experts,
        score_func="sqrtsoftplus",
        gate_temp=1.0,
        norm_topk_prob=True,
        route_scale=spec.route_scale,
        swiglu_limit=spec.swiglu_limit,
        q_lora_rank=spec.q_lora_rank,
        head_dim=spec.head_dim,
        rope_head_dim=spec.rope_head_dim,
        norm_eps=1e-20,
        o_groups=spec.o_groups,
        o_lora_rank=spec.o_lora_rank,
        window_size=spec.window_size,
        compress_ratios=list(spec.compress_ratios) + [0] * n_mtp(spec),
        kv_source_layers=list(spec.kv_source_layers),
        index_source_layers=list(spec.index_source_layers),
        **{**ROPE, **spec.rope},
        index_n_heads=spec.index_n_heads,
        index_head_dim=spec.index_head_dim,
        index_topk=spec.index_topk,
        candidate_source_layer=src,
        candidate_topk_blocks=topk_blocks,
        candidate_block_size=block,
        hc_mult=spec.hc_mult,
        hc_sinkhorn_iters=spec.hc_sinkhorn_iters,
        hc_eps=1e-6,
        vision_n_layers=0,
    )
    d.update(_engram_args(spec, engram_rows, compressed_vocab))
    d.update(_dspark_args(spec, noise_token_id))
    return d


def _engram_args(spec: TinySpec, rows: tuple[int, ...], compressed_vocab: int) -> dict:
    e = spec.engram
    if not e:
        return {}
    return dict(
        engram_layer_ids=list(e["layer_ids"]),
        engram_num_embeddings=list(rows),
        engram_max_ngram_size=e["max_ngram_size"],
        engram_vocab_size=e["vocab_size"],
        engram_n_heads=e["n_heads"],
        engram_head_dim=e["head_dim"],
        engram_pad_id=2,
        engram_compressed_vocab_size=compressed_vocab,
    )


def _dspark_args(spec: TinySpec, noise_token_id: int) -> dict:
    d = spec.dspark
    if not d:
        return {}
    return dict(
        dspark_block_size=d["block_size"],
        dspark_noise_token_id=noise_token_id,
        dspark_target_layer_ids=list(d["target_layer_ids"]),
        dspark_markov_rank=d["markov_rank"],
        dspark_n_routed_experts=d["n_routed_experts"],
        dspark_n_activated_experts=d["n_activated_experts"],
    )


def check(spec: TinySpec) -> None:
    """Raise ``ValueError`` where ``spec`` breaks a shape rule of the reference (see the module docstring)."""
    for name in ("dim", "q_lora_rank", "head_dim", "index_head_dim", "moe_inter_dim"):
        if getattr(spec, name) % 32:
            raise ValueError(f"{spec.name}: {name} must be a multiple of 32")
    if (spec.o_groups * spec.o_lora_rank) % 32:
        raise ValueError(f"{spec.name}: o_groups * o_lora_rank must be a multiple of 32")
    _check_sources(spec)
    src, topk_blocks, block = spec.candidate
    if src >= 0 and (topk_blocks - 1) * block + 1 < spec.index_topk:
        raise ValueError(f"{spec.name}: the candidate pool can hold fewer than index_topk positions")


def _check_sources(spec: TinySpec) -> None:
    ratio_of_source = 0
    for layer, ratio in enumerate(spec.compress_ratios):
        if layer in spec.kv_source_layers:
            if layer not in spec.index_source_layers or ratio == 0:
                raise ValueError(f"{spec.name}: KV source {layer} must be a compressed index source")
            ratio_of_source = ratio
        elif ratio and ratio != ratio_of_source:
            raise ValueError(
                f"{spec.name}: layer {layer} (ratio {ratio}) follows a ratio-{ratio_of_source} source"
            )
    src = spec.candidate[0]
    later = [i for i in spec.index_source_layers if i > src >= 0]
    if any(spec.compress_ratios[i] != spec.compress_ratios[src] for i in later):
        raise ValueError(f"{spec.name}: candidate consumers must share the candidate source's ratio")


def as_dict(spec: TinySpec) -> dict:
    return asdict(spec)
