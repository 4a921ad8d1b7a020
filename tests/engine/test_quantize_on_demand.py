"""On-demand quantized copies (``quantization="fp8"``): written once by the project's tool, reused while the
source is unchanged, refused for a checkpoint that is already quantized; the CLI flag reaches the config."""

from __future__ import annotations

import json

import pytest

from deepinfer_core.cli.args import engine_kwargs
from deepinfer_core.cli.main import build_parser
from deepinfer_core.config import ConfigError
from deepinfer_core.engine.quantize import quantized_copy

from ..models.deepseek_v4.tiny import CSA, Schedule, build_hf, save_deepseek


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_deepseek(build_hf(Schedule("q", (CSA,)), seed=0), tmp_path_factory.mktemp("src"))


def test_the_copy_is_written_once_and_reused_until_the_source_changes(ckpt, tmp_path):
    first = quantized_copy(ckpt, "fp8", str(tmp_path))
    assert json.loads((first / "config.json").read_text())["quantization_config"]["quant_method"] == "fp8"
    stamp = (first / "config.json").stat().st_mtime_ns
    assert quantized_copy(ckpt, "fp8", str(tmp_path)) == first
    assert (first / "config.json").stat().st_mtime_ns == stamp  # not rewritten
    assert quantized_copy(ckpt, "fp4", str(tmp_path)) != first
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(cfg, indent=2))  # the source changed
    assert quantized_copy(ckpt, "fp8", str(tmp_path)) != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-written copies left
    with pytest.raises(ConfigError, match="already quantized"):
        quantized_copy(first, "fp8", str(tmp_path))


def test_the_cli_flag_sets_the_config_field():
    ns = build_parser().parse_args(
        ["generate", "x", "--quantization", "fp8", "--quantization-cache-dir", "/c"]
    )
    kw = engine_kwargs(ns)
    assert (kw["quantization"], kw["quantization_cache_dir"]) == ("fp8", "/c")
