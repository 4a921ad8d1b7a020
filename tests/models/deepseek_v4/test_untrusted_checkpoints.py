"""A checkpoint is untrusted input: shards must stay inside its directory, weights must have dtypes their
slots can take and finite values, id tables must hold ids in range, config values must be finite and
bounded, and a tokenizer that needs the checkpoint's own code is refused, never run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from deepinfer_core.config import ConfigError
from deepinfer_core.engine.loader import load_tokenizer
from deepinfer_core.models.deepseek_v4 import CheckpointError, DeepseekV4ForCausalLM, ModelConfigError
from deepinfer_core.models.weight_checks import LoadOptions

from .tiny import read_state, write_shards

SCHEDULE = "hc1_all_hash"


@pytest.fixture
def ckpt(checkpoints, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(checkpoints.path(SCHEDULE, "deepseek"), dst)
    return dst, read_state(dst)


def _load(path, backends, **options):
    return DeepseekV4ForCausalLM.from_checkpoint(path, backends, torch.float32, LoadOptions(**options))


def _index(path: Path) -> dict:
    return json.loads((path / "model.safetensors.index.json").read_text())


def _set_shard(path: Path, key: str, shard: str) -> None:
    index = _index(path)
    index["weight_map"][key] = shard
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("shard", ["/etc/shadow", "../../x.safetensors", "sub/../../y.safetensors"])
def test_an_index_naming_a_shard_outside_the_checkpoint_is_refused(ckpt, backends, shard):
    path, _ = ckpt
    _set_shard(path, "embed.weight", shard)
    with pytest.raises(CheckpointError, match="not a relative path inside the checkpoint directory"):
        _load(path, backends)


def test_a_symlinked_shard_leaving_the_directory_needs_the_flag(ckpt, backends, tmp_path):
    path, _ = ckpt
    shard = _index(path)["weight_map"]["embed.weight"]
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(path / shard, outside)
    os.symlink(outside, path / shard)
    with pytest.raises(CheckpointError, match="outside the checkpoint directory; set allow_external_shards"):
        _load(path, backends)
    assert _load(path, backends, allow_external_shards=True).vocab_size == 320


def test_the_hugging_face_cache_layout_of_symlinks_into_blobs_loads(ckpt, backends, tmp_path):
    path, _ = ckpt
    repo = tmp_path / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(os.listdir(path))):
        shutil.copy(path / f, blobs / f"blob{i}")
        os.symlink(Path("../../blobs") / f"blob{i}", snap / f)
    assert _load(snap, backends).vocab_size == 320


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        (
            "layers.0.ffn.gate.tid2eid",
            lambda t: t.float(),
            "stored as F32; this tensor must be an integer dtype",
        ),
        ("layers.0.attn_norm.weight", lambda t: t.to(torch.int64), "stored as I64"),
        ("layers.0.attn_norm.weight", lambda t: t > 0, "stored as BOOL"),
    ],
    ids=["float-index", "int-weight", "bool-weight"],
)
def test_weights_of_the_wrong_dtype_are_refused_naming_the_tensor(ckpt, backends, key, value, fragment):
    path, state = ckpt
    state[key] = value(state[key])
    wm = write_shards(state, path)
    with pytest.raises(CheckpointError) as e:
        _load(path, backends)
    assert f"mis-typed: {key} ({wm[key]}): {fragment}" in str(e.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_weights_are_refused_unless_the_check_is_skipped(ckpt, backends, bad):
    path, state = ckpt
    key = "layers.0.attn.wq_b.weight"
    state[key] = state[key].clone()
    state[key][3, 5] = bad
    wm = write_shards(state, path)
    with pytest.raises(CheckpointError, match=rf"{key} \({wm[key]}\) holds 1 non-finite values"):
        _load(path, backends)
    _load(path, backends, check_weights_finite=False)  # trusted: loads (and would compute garbage)


def test_a_tid2eid_entry_outside_the_experts_is_refused_naming_the_tensor(ckpt, backends):
    path, state = ckpt
    key = "layers.0.ffn.gate.tid2eid"
    state[key] = state[key].clone()
    state[key][17, 1] = 8  # 8 routed experts: ids 0..7
    wm = write_shards(state, path)
    with pytest.raises(CheckpointError, match=rf"{key} \({wm[key]}\): holds id 8, outside \[0, 8\)"):
        _load(path, backends)


@pytest.mark.parametrize(
    "field,value,fragment",
    [
        ("routed_scaling_factor", float("inf"), "routed_scaling_factor=inf must be a finite positive number"),
        ("swiglu_limit", float("nan"), "swiglu_limit=nan must be a finite number"),
        ("rms_norm_eps", 1e30, "rms_norm_eps=1e+30 must be a finite positive number in (0, 1]"),
        ("hc_sinkhorn_iters", 10**7, "hc_sinkhorn_iters=10000000 must be an integer in [1, 1000]"),
        ("eos_token_id", 320, "eos_token_id 320 is outside the vocabulary [0, 320)"),
        ("eos_token_id", [1, -4], "eos_token_id -4 is outside the vocabulary"),
    ],
)
def test_absurd_config_values_are_refused_naming_the_field(ckpt, backends, field, value, fragment):
    path, _ = ckpt
    cfg = json.loads((path / "config.json").read_text())
    cfg[field] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError) as e:
        _load(path, backends)
    assert fragment in str(e.value)


def test_a_tokenizer_that_needs_checkpoint_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v4"}))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}})
    )
    (tmp_path / "tokenization_evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass EvilTokenizer: pass\n"
    )
    with pytest.raises(ConfigError, match="never runs code from a checkpoint"):
        load_tokenizer(tmp_path, skip=False)
    assert not marker.exists()
