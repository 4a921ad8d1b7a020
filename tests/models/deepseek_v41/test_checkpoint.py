"""Loading V4.1 checkpoints in DeepSeek's published layout: the golden checkpoints load with the stored formats
kept, the architecture is chosen by ``architectures`` / ``model_type``, and broken checkpoints (truncated,
mis-shaped, mis-named, mis-typed) get an error naming the tensor and its file."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepinfer_core.engine.loader import model_class
from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointError
from deepinfer_core.models.deepseek_v41 import DeepseekV41Config, DeepseekV41ForCausalLM
from deepinfer_core.models.deepseek_v41.roles import FULL, REINDEX, REUSE, SWA, decoder_start
from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.quant_formats import dequant
from deepinfer_core.ops.reference import reference_op
from tests.models.deepseek_v41.goldens import CONFIGS, checkpoint, inference_config

BACKENDS = Backends("reference", **{c: reference_op(c) for c in CONCERNS})
SHARD = "model-00002-of-00002.safetensors"


def load(path):
    return DeepseekV41ForCausalLM.from_checkpoint(path, BACKENDS, torch.float32)


@pytest.mark.parametrize("name", CONFIGS)
def test_root_config_nests_text_settings_and_matches_the_reference_args(name):
    raw = json.loads((checkpoint(name) / "config.json").read_text())
    cfg = DeepseekV41Config.from_dict(raw)
    ref = inference_config(name)
    assert "text_config" in raw and "hidden_size" not in raw
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.sliding_window) == (
        ref["dim"],
        ref["n_layers"],
        ref["window_size"],
    )
    assert cfg.compress_ratios == tuple(ref["compress_ratios"])
    assert cfg.kv_source_layers == tuple(ref["kv_source_layers"])
    assert cfg.routed_scaling_factor == ref["route_scale"] and cfg.index_topk == ref["index_topk"]
    # DeepSeek's ModelArgs names read the same (the runtime limit max_seq_len is not in that file)
    assert (
        DeepseekV41Config.from_dict({**ref, "max_seq_len": cfg.max_position_embeddings, "eos_token_id": 1})
        == cfg
    )


def test_flash_mini_roles_follow_the_published_pattern():
    cfg = DeepseekV41Config.from_dict(json.loads((checkpoint("flash_mini") / "config.json").read_text()))
    kinds = [r.kind for r in cfg.roles]
    assert kinds == [SWA, FULL, REUSE, FULL, REUSE, FULL, REUSE, REINDEX, REUSE]
    assert [r.kv_source for r in cfg.roles] == [-1, 1, 1, 3, 3, 5, 5, 5, 5]
    assert cfg.roles[5].candidate_source and cfg.roles[7].uses_candidates
    assert decoder_start(cfg.roles) == 6


def test_architecture_selects_v41(tmp_path):
    models = {"DeepseekV4ForCausalLM": object, "DeepseekV41ForCausalLM": DeepseekV41ForCausalLM}
    assert model_class(checkpoint("reindex_r2"), models) is DeepseekV41ForCausalLM
    d = tmp_path / "m"
    d.mkdir()
    raw = json.loads((checkpoint("reindex_r2") / "config.json").read_text())
    raw.pop("architectures")
    (d / "config.json").write_text(json.dumps(raw))
    assert model_class(d, {"deepseek_v41": DeepseekV41ForCausalLM}) is DeepseekV41ForCausalLM


def test_golden_checkpoint_loads_with_stored_formats():
    path = checkpoint("flash_mini")
    model = load(path)
    stored = load_file(str(path / "model-00001-of-00002.safetensors")) | load_file(str(path / SHARD))
    attn = model.layers[1].attn
    assert attn.wq_a.value.format == "fp8_block32" and attn.wq_a.value.scale.shape == (1, 1)
    w = dequant(attn.wq_a.value, torch.float32)
    s = stored["layers.1.attn.wq_a.scale"].float()
    assert torch.equal(w, stored["layers.1.attn.wq_a.weight"].float() * s)
    e = model.layers[0].ffn.experts[2].w1.value
    assert e.format == "fp4_e2m1" and torch.equal(
        e.data, stored["layers.0.ffn.experts.2.w1.weight"].view(torch.uint8)
    )
    table = model.layers[0].engram.embed.value
    assert table.codes.dtype == torch.float8_e4m3fn and table.scales.shape == (304, 1)
    assert torch.equal(
        table.codes.view(torch.uint8), stored["layers.0.engram.embed.weight"].view(torch.uint8)
    )
    assert torch.equal(model.head.value, stored["head.weight"].float())


@pytest.fixture()
def broken(tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoint("reindex_r2"), dst)
    return dst


def _rewrite(path, edit, shard=SHARD):
    tensors = load_file(str(path / shard))
    edit(tensors)
    save_file(tensors, str(path / shard))
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: f for k, f in index["weight_map"].items() if f != shard} | {
        k: shard for k in tensors
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def _some_key(path, suffix):
    return next(
        k for k in sorted(load_file(str(path / SHARD))) if k.endswith(suffix) and not k.startswith("mtp.")
    )


def test_truncated_shard_names_the_first_tensor_it_lacks(broken):
    data = (broken / SHARD).read_bytes()
    (broken / SHARD).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated: \S+ \(model-00002-of-00002\.safetensors\)"):
        load(broken)


def test_mis_shaped_tensor_is_named_with_its_file(broken):
    key = _some_key(broken, "attn_norm.weight")
    _rewrite(broken, lambda t: t.__setitem__(key, torch.ones(5, dtype=torch.bfloat16)))
    with pytest.raises(CheckpointError, match=rf"mis-shaped: {key} \({SHARD}\)"):
        load(broken)


def test_mis_named_tensor_is_reported_missing_and_unexpected(broken):
    key = _some_key(broken, "ffn_norm.weight")
    _rewrite(broken, lambda t: t.__setitem__(key.replace("ffn_norm", "ffn_nrm"), t.pop(key)))
    with pytest.raises(CheckpointError) as e:
        load(broken)
    assert f"missing: {key}" in str(e.value)
    assert f"unexpected: {key.replace('ffn_norm', 'ffn_nrm')} ({SHARD})" in str(e.value)


def test_fp8_weight_without_its_scale_is_refused(broken):
    weight_map = json.loads((broken / "model.safetensors.index.json").read_text())["weight_map"]
    scale = "layers.2.attn.wkv.scale"
    _rewrite(broken, lambda t: t.pop(scale), weight_map[scale])
    with pytest.raises(CheckpointError, match=rf"missing: {scale} \(the scale of layers.2.attn.wkv.weight"):
        load(broken)


def test_fp4_expert_stored_as_float_is_mis_typed(broken):
    key = _some_key(broken, "experts.1.w2.weight")
    _rewrite(broken, lambda t: t.__setitem__(key, torch.zeros(t[key].shape, dtype=torch.bfloat16)))
    with pytest.raises(CheckpointError, match=rf"mis-typed: {key} \({SHARD}\): stored as BF16"):
        load(broken)
