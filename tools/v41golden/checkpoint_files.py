"""A tiny V4.1 checkpoint directory in the published layout.

::

    config.json                    root config (transformers-style, text settings in text_config)
    inference/config.json          the same model in the reference's ModelArgs names
    tokenizer.json, tokenizer_config.json
    model-00001-of-00002.safetensors, model-00002-of-00002.safetensors
    model.safetensors.index.json   {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}

Tensors are dealt round-robin over the shards in name order, so a weight and its ``.scale`` land in
different files and a loader has to follow the index.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import hf_config
from .files import write_json, write_tensors
from .tokenizer import SPECIALS

SHARDS = 2
INDEX = "model.safetensors.index.json"


def write_shards(state: dict[str, torch.Tensor], path: Path, shards: int = SHARDS) -> dict[str, str]:
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_tensors(path / file, {k: state[k] for k in part})
        weight_map.update({k: file for k in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    write_json(
        path / INDEX, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    )
    return weight_map


def write_tokenizer(tok, path: Path, max_len: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": SPECIALS[0],
            "eos_token": SPECIALS[1],
            "pad_token": SPECIALS[2],
            "model_max_length": max_len,
            "clean_up_tokenization_spaces": False,
        },
    )


def write_checkpoint(path: Path, args: dict, state: dict[str, torch.Tensor], tok, max_len: int) -> None:
    """Write the whole directory; ``args`` are the ``inference/config.json`` values."""
    for old in path.glob("*.safetensors"):
        old.unlink()
    write_json(path / "config.json", hf_config.render(args, max_len))
    write_json(path / "inference" / "config.json", args)
    write_tokenizer(tok, path, max_len)
    write_shards(state, path)
