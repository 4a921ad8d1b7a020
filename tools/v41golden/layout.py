"""Every tensor of a tiny V4.1 checkpoint in the published layout: name, logical shape, stored format.

Formats (``fmt``):

- ``fp8``: F8_E4M3 ``[out, in]`` plus ``<module>.scale`` F8_E8M0 ``[ceil(out/32), ceil(in/32)]`` (32x32 blocks);
- ``fp4``: routed experts, I8 ``[out, in/2]`` (two e2m1 codes a byte, element ``2i`` in the low nibble) plus
  ``.scale`` F8_E8M0 ``[out, in/32]``;
- ``fp8_rows``: the Engram tables, F8_E4M3 ``[rows, head_dim]`` plus ``.scale`` F8_E8M0 ``[rows, head_dim/32]``
  (one scale per row and 32 channels, not 32x32 blocks);
- ``bf16`` / ``f32``: unquantised.

Names carry no ``model.`` prefix. DSpark stages live under ``mtp.K.`` and share the backbone's ``embed`` and
``head`` (not stored again). ``init`` is the standard deviation of the random weights (``mean`` offsets norms
and scales to about one).
"""

from __future__ import annotations

from dataclasses import dataclass

from .configs import TinySpec, n_mtp


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    fmt: str
    std: float
    mean: float = 0.0


def _linear(name: str, out_f: int, in_f: int, fmt: str) -> TensorSpec:
    return TensorSpec(name, (out_f, in_f), fmt, in_f**-0.5)


def _norm(name: str, dim: int) -> TensorSpec:
    return TensorSpec(name, (dim,), "bf16", 0.1, 1.0)


def _hc(p: str, s: TinySpec) -> list[TensorSpec]:
    mix = (2 + s.hc_mult) * s.hc_mult
    out = []
    for site in ("attn", "ffn"):
        out += [
            TensorSpec(f"{p}hc_{site}_fn", (mix, s.hc_mult * s.dim), "f32", 0.05),
            TensorSpec(f"{p}hc_{site}_base", (mix,), "f32", 0.3),
            TensorSpec(f"{p}hc_{site}_scale", (3,), "f32", 0.1, 1.0),
        ]
    return out


def _attention(p: str, s: TinySpec) -> list[TensorSpec]:
    a, hd = f"{p}attn.", s.head_dim
    return [
        TensorSpec(f"{a}attn_sink", (s.n_heads,), "f32", 0.5),
        _linear(f"{a}wq_a.weight", s.q_lora_rank, s.dim, "fp8"),
        _norm(f"{a}q_norm.weight", s.q_lora_rank),
        _linear(f"{a}wq_b.weight", s.n_heads * hd, s.q_lora_rank, "fp8"),
        _linear(f"{a}wkv.weight", hd, s.dim, "fp8"),
        _norm(f"{a}kv_norm.weight", hd),
        _linear(f"{a}wo_a.weight", s.o_groups * s.o_lora_rank, s.n_heads * hd // s.o_groups, "fp8"),
        _linear(f"{a}wo_b.weight", s.dim, s.o_groups * s.o_lora_rank, "fp8"),
    ]


def _csa(p: str, layer: int, s: TinySpec) -> list[TensorSpec]:
    """Compressor and indexer-key tensors of a KV source; indexer query of an index source."""
    a, out = f"{p}attn.", []
    if layer in s.kv_source_layers:
        out += [_linear(f"{a}compressor.wkv.weight", s.head_dim, s.dim, "bf16")]
        if s.compress_ratios[layer] > 1:
            out += [_linear(f"{a}compressor.wgate.weight", s.head_dim, s.dim, "bf16")]
        out += [
            _norm(f"{a}compressor.norm.weight", s.head_dim),
            _linear(f"{a}indexer.wk.weight", s.index_head_dim, s.head_dim, "bf16"),
            _norm(f"{a}indexer.k_norm.weight", s.index_head_dim),
        ]
    if layer in s.index_source_layers:
        out += [
            _linear(f"{a}indexer.wq_b.weight", s.index_n_heads * s.index_head_dim, s.q_lora_rank, "fp8"),
            _linear(f"{a}indexer.weights_proj.weight", s.index_n_heads, s.dim, "bf16"),
        ]
    return out


def _moe(p: str, n_experts: int, s: TinySpec) -> list[TensorSpec]:
    f, inter = f"{p}ffn.", s.moe_inter_dim
    out = [
        _linear(f"{f}gate.weight", n_experts, s.dim, "bf16"),
        TensorSpec(f"{f}gate.bias", (n_experts,), "f32", 0.1),
    ]
    for e in range(n_experts):
        out += [
            _linear(f"{f}experts.{e}.w1.weight", inter, s.dim, "fp4"),
            _linear(f"{f}experts.{e}.w2.weight", s.dim, inter, "fp4"),
            _linear(f"{f}experts.{e}.w3.weight", inter, s.dim, "fp4"),
        ]
    out += [
        _linear(f"{f}shared_experts.w1.weight", inter, s.dim, "fp8"),
        _linear(f"{f}shared_experts.w2.weight", s.dim, inter, "fp8"),
        _linear(f"{f}shared_experts.w3.weight", inter, s.dim, "fp8"),
    ]
    return out


def _engram(p: str, rows: int, s: TinySpec) -> list[TensorSpec]:
    e, hd = s.engram, s.engram["head_dim"]
    cols = (e["max_ngram_size"] - 1) * e["n_heads"] * hd
    return [
        TensorSpec(f"{p}engram.embed.weight", (rows, hd), "fp8_rows", 1.0),
        _linear(f"{p}engram.wkv.weight", s.dim * (s.hc_mult + 1), cols, "fp8"),
        TensorSpec(f"{p}engram.q_weight", (s.hc_mult, s.dim), "bf16", 0.1, 1.0),
        TensorSpec(f"{p}engram.k_weight", (s.hc_mult, s.dim), "bf16", 0.1, 1.0),
    ]


def _block(p: str, layer: int, n_experts: int, s: TinySpec) -> list[TensorSpec]:
    out = [_norm(f"{p}attn_norm.weight", s.dim), _norm(f"{p}ffn_norm.weight", s.dim)]
    return out + _hc(p, s) + _attention(p, s) + _moe(p, n_experts, s)


def _dspark_stage(k: int, vocab: int, s: TinySpec) -> list[TensorSpec]:
    p, d = f"mtp.{k}.", s.dspark
    out = _block(p, s.n_layers + k, d["n_routed_experts"], s)
    if k == 0:
        out += [
            _linear(f"{p}main_proj.weight", s.dim, s.dim * len(d["target_layer_ids"]), "fp8"),
            _norm(f"{p}main_norm.weight", s.dim),
        ]
    if k == n_mtp(s) - 1:
        rank = d["markov_rank"]
        out += [
            _norm(f"{p}norm.weight", s.dim),
            TensorSpec(f"{p}markov_head.embed.weight", (vocab, rank), "bf16", 1.0),
            _linear(f"{p}markov_head.head.weight", vocab, rank, "bf16"),
            _linear(f"{p}confidence_head.proj.weight", 1, s.dim + rank, "bf16"),
        ]
    return out


def tensors(s: TinySpec, vocab: int, engram_rows: tuple[int, ...]) -> list[TensorSpec]:
    """All tensors of the checkpoint (scales not listed: they follow from ``fmt``)."""
    out = [
        TensorSpec("embed.weight", (vocab, s.dim), "bf16", 1.0),
        TensorSpec("head.weight", (vocab, s.dim), "bf16", 2 * s.dim**-0.5),  # logits with a std of about 2
        _norm("norm.weight", s.dim),
    ]
    engram_ids = tuple(s.engram.get("layer_ids", ()))
    for layer in range(s.n_layers):
        p = f"layers.{layer}."
        out += _block(p, layer, s.n_routed_experts, s) + _csa(p, layer, s)
        if layer in engram_ids:
            out += _engram(p, engram_rows[engram_ids.index(layer)], s)
    for k in range(n_mtp(s)):
        out += _dspark_stage(k, vocab, s)
    return out
