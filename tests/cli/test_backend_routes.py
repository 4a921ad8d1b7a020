"""The example third-party backend is selectable by each of the four configuration routes, and its own
ops really run: ``LLM(backend=...)``, ``--backend``, ``DEEPINFER_BACKEND`` and ``--config file``."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.cli.main import main

from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf

pytestmark = pytest.mark.skipif(
    "example" not in {ep.name for ep in md.entry_points(group="deepinfer")},
    reason="examples/third_party_backend is not installed (nox -s tests installs it)",
)
PROMPTS = [[5, 9, 13, 2, 77, 31], [3, 4]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("v4")
    build_hf(Schedule("routes", (CSA, HCA)), seed=1).save_pretrained(path)
    prompts = path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt_token_ids": p}) for p in PROMPTS))
    return path


@pytest.fixture(scope="module")
def reference_tokens(ckpt):
    llm = LLM(str(ckpt), backend="reference", kv_cache_memory_bytes=16 << 20, max_model_len=64)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(max_tokens=3, ignore_eos=True),
        use_tqdm=False,
    )
    return [o.outputs[0].token_ids for o in outs]


def test_llm_argument_selects_example_and_its_rms_norm_runs(ckpt, reference_tokens, monkeypatch):
    from deepinfer_example_backend.ops import ExampleDenseOps

    calls = []
    original = ExampleDenseOps.rms_norm
    monkeypatch.setattr(ExampleDenseOps, "rms_norm", lambda self, *a: calls.append(1) or original(self, *a))
    llm = LLM(str(ckpt), backend="example", kv_cache_memory_bytes=16 << 20, max_model_len=64)
    assert llm.backend_name == "example"
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(max_tokens=3, ignore_eos=True),
        use_tqdm=False,
    )
    assert calls, "the example backend's own rms_norm was never called"
    assert [o.outputs[0].token_ids for o in outs] == reference_tokens


def _cli(ckpt, capsys, *extra) -> list[list[int]]:
    args = ["generate", "--model", str(ckpt), "--input-file", str(ckpt / "prompts.jsonl"), "--json",
            "--max-tokens", "3", "--ignore-eos", "--kv-cache-memory-bytes", str(16 << 20), "--max-model-len", "64", *extra]  # fmt: skip
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "deepinfer: backend example" in cap.err
    return [r["outputs"][0]["token_ids"] for r in json.loads(cap.out)]


def test_cli_flag_selects_example(ckpt, reference_tokens, capsys):
    assert _cli(ckpt, capsys, "--backend", "example") == reference_tokens


def test_environment_variable_selects_example(ckpt, reference_tokens, capsys, monkeypatch):
    monkeypatch.setenv("DEEPINFER_BACKEND", "example")
    assert _cli(ckpt, capsys) == reference_tokens


def test_config_file_selects_example(ckpt, reference_tokens, capsys, tmp_path):
    cfg = tmp_path / "engine.toml"
    cfg.write_text('[deepinfer]\nbackend = "example"\n')
    assert _cli(ckpt, capsys, "--config", str(cfg)) == reference_tokens


def test_unavailable_cuda_backend_fails_with_the_reason(ckpt, capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                str(ckpt),
                "--backend",
                "cuda_sm100",
                "--input-file",
                str(ckpt / "prompts.jsonl"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "'cuda_sm100' is installed but unavailable" in err and "reference (available)" in err
