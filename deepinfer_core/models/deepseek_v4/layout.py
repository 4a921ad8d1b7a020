"""Checkpoint key layouts, normalised to DeepSeek's published names (the model's own slot names).

Three spellings of the same tensors are accepted:

- DeepSeek's: ``embed.weight``, ``layers.3.attn.wq_a.weight``, ``layers.3.attn.indexer.compressor.wkv.weight``,
  ``layers.3.ffn.experts.17.w1.weight``, ``hc_head_fn``, ``head.weight``, ``mtp.0.e_proj.weight`` ...
- transformers' module names (``save_pretrained(save_original_format=False)``):
  ``model.layers.3.self_attn.q_a_proj.weight``, ``lm_head.weight``, stacked
  ``model.layers.3.mlp.experts.gate_up_proj [E, 2I, D]`` (w1 rows, then w3 rows) and ``...down_proj [E, D, I]``;
- what transformers 5.x ``save_pretrained`` writes by default (its conversion mapping reverted): DeepSeek's
  names under ``model.`` (``model.layers.3.attn.wq_a.weight``, ``model.embed_tokens.weight``, ``model.norm.weight``,
  ``model.hc_head.hc_fn``, ``head.weight``), with the attention's ``kv_norm`` spelled ``attn.norm``.

transformers does not instantiate MTP, so ``mtp.*`` keys always carry DeepSeek's names. The renames mirror
transformers' ``conversion_mapping.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

_TOP = {
    "embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "hc_head.hc_fn": "hc_head_fn",
    "hc_head.hc_base": "hc_head_base",
    "hc_head.hc_scale": "hc_head_scale",
}
_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    **{f"{s}_hc.{k}": f"hc_{s}_{k}" for s in ("attn", "ffn") for k in ("fn", "base", "scale")},
    "self_attn.sinks": "attn.attn_sink",
    "self_attn.q_a_proj.weight": "attn.wq_a.weight",
    "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight",
    "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight",
    "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "mlp.gate.weight": "ffn.gate.weight",
    "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.experts.gate_up_proj": "ffn.experts.gate_up_proj",  # stacked: fills every expert's w1 and w3
    "mlp.experts.down_proj": "ffn.experts.down_proj",  # stacked: fills every expert's w2
    "attn.norm.weight": "attn.kv_norm.weight",  # transformers' reverted spelling
}
_COMPRESSOR_PARENT = {
    "self_attn.compressor.indexer.": "attn.indexer.compressor.",
    "self_attn.compressor.": "attn.compressor.",
}
_COMPRESSOR = {
    "position_bias": "ape",
    "kv_proj.weight": "wkv.weight",
    "gate_proj.weight": "wgate.weight",
    "kv_norm.weight": "norm.weight",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_STACKED = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(gate_up_proj|down_proj)$")

Extract = Callable[[torch.Tensor], torch.Tensor]


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass
class Source:
    """One checkpoint tensor and the model slots it fills (a stacked expert tensor fills several)."""

    key: str
    shape: tuple[int, ...]
    targets: list[tuple[str, Extract]] = field(default_factory=list)
    quantizable: bool = False  # a linear weight: may come as FP8 / FP4 data plus a scale companion


def layout_name(keys: Iterable[str]) -> str:
    """``"transformers"`` when keys carry transformers' ``model.`` / ``lm_head`` prefixes, else ``"deepseek"``."""
    return (
        "transformers"
        if any(k.startswith("model.") or k.startswith("lm_head.") for k in keys)
        else "deepseek"
    )


def canonical_name(key: str) -> str:
    """DeepSeek's name for a checkpoint key of any accepted layout (stacked experts keep a pseudo-name)."""
    name = key[len("model.") :] if key.startswith("model.") else key
    if name in _TOP:
        return _TOP[name]
    m = _LAYER.match(name)
    if not m:
        return name
    layer, rest = m.groups()
    if rest in _BLOCK:
        return f"layers.{layer}.{_BLOCK[rest]}"
    for hf, ds in _COMPRESSOR_PARENT.items():
        if rest.startswith(hf) and rest[len(hf) :] in _COMPRESSOR:
            return f"layers.{layer}.{ds}{_COMPRESSOR[rest[len(hf) :]]}"
    return name


def scale_companions(keys: set[str]) -> dict[str, str]:
    """Weight key -> its scale key: ``X.scale`` (DeepSeek-V4) or ``X.weight_scale_inv`` (DeepSeek-V3 / transformers)."""
    out = {}
    for k in keys:
        if k.endswith(".scale") and k[: -len(".scale")] + ".weight" in keys:
            out[k[: -len(".scale")] + ".weight"] = k
        elif k.endswith(".weight_scale_inv") and k[: -len("_scale_inv")] in keys:
            out[k[: -len("_scale_inv")]] = k
    return out


def build_plan(
    slots: dict[str, tuple[tuple[int, ...], bool]], keys: list[str]
) -> tuple[dict[str, Source], list[str]]:
    """Match checkpoint ``keys`` (scale companions excluded) to slots (``name -> (shape, is_linear)``).

    Returns ``(plan, problems)``: the :class:`Source` of every matched key, and one line per key that
    fills no slot or fills a slot another key already fills."""
    plan: dict[str, Source] = {}
    owner: dict[str, str] = {}
    problems: list[str] = []
    for key in keys:
        name = canonical_name(key)
        targets = [(name, _whole)] if name in slots else _stacked_targets(name, slots)
        if not targets:
            problems.append(f"unexpected: {key}")
            continue
        for t, _ in targets:
            if t in owner:
                problems.append(f"duplicate: {key} and {owner[t]} both provide {t}")
            owner[t] = key
        shape, linear = slots[name] if name in slots else (_stacked_shape(name, slots), False)
        plan[key] = Source(key, shape, targets, quantizable=linear)
    return plan, problems


def _stacked_targets(name: str, slots: dict[str, tuple[tuple[int, ...], bool]]) -> list[tuple[str, Extract]]:
    m = _STACKED.match(name)
    if not m:
        return []
    layer, kind = m.groups()
    n = _num_experts(layer, slots)
    if kind == "down_proj":
        return [(f"layers.{layer}.ffn.experts.{e}.w2.weight", _pick(e, None, None)) for e in range(n)]
    inter = slots[f"layers.{layer}.ffn.experts.0.w1.weight"][0][0] if n else 0
    return [
        t
        for e in range(n)
        for t in (
            (f"layers.{layer}.ffn.experts.{e}.w1.weight", _pick(e, 0, inter)),
            (f"layers.{layer}.ffn.experts.{e}.w3.weight", _pick(e, inter, 2 * inter)),
        )
    ]


def _pick(e: int, lo: int | None, hi: int | None) -> Extract:
    return (lambda t: t[e]) if lo is None else (lambda t: t[e, lo:hi])


def _num_experts(layer: str, slots: dict[str, tuple[tuple[int, ...], bool]]) -> int:
    n = 0
    while f"layers.{layer}.ffn.experts.{n}.w1.weight" in slots:
        n += 1
    return n


def _stacked_shape(name: str, slots: dict[str, tuple[tuple[int, ...], bool]]) -> tuple[int, ...]:
    layer, kind = _STACKED.match(name).groups()
    n = _num_experts(layer, slots)
    w1 = slots[f"layers.{layer}.ffn.experts.0.w1.weight"][0]
    return (n, w1[1], w1[0]) if kind == "down_proj" else (n, 2 * w1[0], w1[1])
