"""`deepinfer plugins`: distributions, hooks, platforms and availability, as text and JSON."""

from __future__ import annotations

import json

from deepinfer_core.cli.main import main


def test_plugins_json_lists_the_builtin_reference_platform(capsys, monkeypatch):
    monkeypatch.setenv("DEEPINFER_PLUGINS", "")
    assert main(["plugins", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    [builtin] = info["plugins"]
    assert builtin["distribution"].startswith("deepinfer-core")
    assert builtin["platforms"]["reference"]["available"] is True
    assert "DeepseekV4ForCausalLM" in builtin["models"]
    assert info["auto"] == "reference" and info["failed"] == []


def test_plugins_text_shows_hooks_and_why_a_platform_is_unavailable(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "platform reference (priority 0): available" in out
    assert "hooks: deepinfer_register_models, deepinfer_register_platforms" in out
    if "cuda_sm100" in out:
        assert "platform cuda_sm100 (priority 100): unavailable - " in out
    assert "backend=auto selects: reference" in out


def test_a_bad_config_value_is_one_clear_line(capsys, monkeypatch):
    monkeypatch.setenv("DEEPINFER_MAX_NUM_SEQS", "lots")
    assert main(["plugins"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("deepinfer: error: invalid engine configuration: max_num_seqs='lots'")
