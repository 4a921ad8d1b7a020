"""`deepinfer generate | chat | bench` on the built-in demo checkpoint (built once into a temp cache)."""

from __future__ import annotations

import json

import pytest

from deepinfer_core.cli.main import main


@pytest.fixture(scope="module", autouse=True)
def demo_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DEEPINFER_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("DEEPINFER_KV_CACHE_MEMORY_BYTES", str(32 << 20))
    yield
    mp.undo()


def test_generate_uses_the_demo_checkpoint_by_default(capsys):
    assert main(["generate", "def quicksort(xs):", "--max-tokens", "5", "--ignore-eos", "--json"]) == 0
    [rec] = json.loads(capsys.readouterr().out)
    assert rec["prompt"] == "def quicksort(xs):" and len(rec["outputs"][0]["token_ids"]) == 5
    assert rec["outputs"][0]["finish_reason"] == "length"


def test_generate_reads_prompts_from_a_text_file(tmp_path, capsys):
    f = tmp_path / "prompts.txt"
    f.write_text("import os\n\nclass A:\n")
    assert main(["generate", "--input-file", str(f), "--max-tokens", "2", "--ignore-eos", "--json", "--temperature", "0.7", "--seed", "1"]) == 0  # fmt: skip
    recs = json.loads(capsys.readouterr().out)
    assert [r["prompt"] for r in recs] == ["import os", "class A:"]


def test_chat_one_turn(capsys):
    assert main(["chat", "--message", "hello", "--max-tokens", "4", "--json"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["role"] == "assistant" and isinstance(line["content"], str)


def test_bench_reports_throughput_and_latency(capsys):
    assert main(["bench", "--num-prompts", "3", "--input-len", "8", "--output-len", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["backend"] == "reference" and res["num_prompts"] == 3
    assert res["output_tokens_per_s"] > 0 and res["mean_ttft_s"] > 0


def test_missing_input_file_is_a_clear_error():
    with pytest.raises(SystemExit, match="does not exist"):
        main(["generate", "--input-file", "/nonexistent/prompts.txt"])
