"""A broken checkpoint fails before any weight is read, with one error that lists every problem and its file."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from deepinfer_core.models.deepseek_v4 import CheckpointError, DeepseekV4ForCausalLM, ModelConfigError
from deepinfer_core.ops.quant_formats import quantize_fp8_block

from .tiny import read_state, write_shards

SCHEDULE = "hc1_all_hash"


@pytest.fixture
def ckpt(checkpoints, tmp_path):
    """A private copy of a good DeepSeek-layout checkpoint, and its tensors."""
    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoints.path(SCHEDULE, "deepseek"), dst)
    return dst, read_state(dst)


def _load(path, backends):
    return DeepseekV4ForCausalLM.from_checkpoint(path, backends, torch.float32)


def _fails(path, backends, *fragments: str, exc: type[Exception] = CheckpointError) -> str:
    with pytest.raises(exc) as info:
        _load(path, backends)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in error:\n{msg}"
    return msg


def test_missing_unexpected_and_misshaped_tensors_in_one_error(ckpt, backends):
    path, state = ckpt
    del state["layers.0.attn.wq_a.weight"]
    state["layers.0.attn.bogus.weight"] = torch.ones(2, 2)
    state["embed.weight"] = torch.ones(321, 64)
    wm = write_shards(state, path)
    _fails(
        path,
        backends,
        "3 problem(s)",
        "missing: layers.0.attn.wq_a.weight",
        f"unexpected: layers.0.attn.bogus.weight ({wm['layers.0.attn.bogus.weight']})",
        f"mis-shaped: embed.weight ({wm['embed.weight']}): expected [320, 64], got [321, 64]",
    )


def test_long_problem_lists_are_cut_at_twenty(ckpt, backends):
    path, state = ckpt
    write_shards({k: v for k, v in state.items() if not k.startswith("layers.2.")}, path)
    msg = _fails(path, backends, "missing: layers.2.", "... and ")
    assert msg.count("\n  missing: ") == 20


def test_missing_shard_is_named(ckpt, backends):
    path, _ = ckpt
    (path / "model-00002-of-00002.safetensors").unlink()
    _fails(path, backends, "missing shard: model-00002-of-00002.safetensors (holds ")


def test_index_naming_a_tensor_its_shard_lacks(ckpt, backends):
    path, _ = ckpt
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.0.attn.ghost.weight"] = "model-00001-of-00002.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    _fails(path, backends, "layers.0.attn.ghost.weight: listed in model.safetensors.index.json")


def test_single_file_checkpoint_without_index_loads(ckpt, backends):
    path, state = ckpt
    write_shards(state, path, shards=1)
    (path / "model.safetensors.index.json").unlink()
    (path / "model-00001-of-00001.safetensors").rename(path / "model.safetensors")
    assert _load(path, backends).layout == "deepseek"


def test_fp8_weight_without_scale_and_with_wrong_scale(ckpt, backends):
    path, state = ckpt
    q = quantize_fp8_block(state["layers.0.attn.wq_b.weight"])
    state["layers.0.attn.wq_b.weight"] = q.data
    state["layers.1.attn.wq_b.weight"] = q.data.clone()
    state["layers.1.attn.wq_b.scale"] = torch.ones(3, 3)
    write_shards(state, path)
    _fails(
        path,
        backends,
        "mis-shaped: layers.0.attn.wq_b.weight",
        "F8_E4M3 weight without a scale companion",
        "mis-shaped: layers.1.attn.wq_b.weight",
        "scale [3, 3], expected [128, 32] / [1, 1]",
    )


def test_scale_on_a_weight_that_cannot_be_quantized(ckpt, backends):
    path, state = ckpt
    state["layers.0.attn.q_norm.scale"] = torch.ones(1, 1)
    write_shards(state, path)
    _fails(
        path,
        backends,
        "unexpected: layers.0.attn.q_norm.scale",
        "layers.0.attn.q_norm.weight cannot be quantized",
    )


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_unknown_architecture(ckpt, backends):
    path, _ = ckpt
    _edit_config(path, architectures=["LlamaForCausalLM"])
    _fails(path, backends, "unknown architecture", "LlamaForCausalLM", "DeepseekV4ForCausalLM")


def test_missing_config(ckpt, backends):
    path, _ = ckpt
    (path / "config.json").unlink()
    _fails(path, backends, "no config.json")


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"hc_mult": 0}, "hc_mult"),
        ({"compress_ratios": [128, 0, 1, 0]}, "compress_ratios[2]"),
        ({"compress_ratios": [16, 0]}, "compress_ratios has 2 entries"),
        ({"scoring_func": "relu"}, "scoring_func"),
        ({"vocab_size": None}, "vocab_size"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"index_head_dim": 4}, "index_head_dim"),
        ({"rope_scaling": {"type": "longrope", "factor": 2}}, "longrope"),
    ],
)
def test_bad_config_field_is_named(ckpt, backends, changes, field):
    path, _ = ckpt
    _edit_config(path, **changes)
    _fails(path, backends, field, exc=ModelConfigError)
