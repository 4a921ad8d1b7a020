"""The example plugin's grammar backend through the engine, on the demo checkpoint: selected by name as an
argument, a ``DEEPINFER_STRUCTURED_OUTPUTS_BACKEND`` variable or a config file, its constrained outputs
satisfy their constraints; a grammar backend nothing registered fails when the engine is built."""

from __future__ import annotations

import pytest

from deepinfer_core import LLM, SamplingParams, StructuredOutputsParams
from deepinfer_core.config import ConfigError, load_config
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.runtime import build_registry
from deepinfer_example_backend.grammar import ChoiceBackend

from .conftest import EOS

KW = {"model": "demo-v4", "backend": "example", "kv_cache_memory_bytes": 16 << 20, "max_model_len": 128}
CHOICES = ["gam", "gamma ray", "beta", "delta (d)"]


@pytest.fixture(scope="module")
def llm():
    return LLM(structured_outputs_backend="example_choice", **KW)


def _choice(seed: int, choices=CHOICES) -> SamplingParams:
    so = StructuredOutputsParams(choice=choices)
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=24, structured_outputs=so)


def _assert_constrained(outs, alternatives) -> list[str]:
    texts = []
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason == "stop" and c.token_ids[-1] == EOS, (c.text, c.finish_reason)
        assert c.text in alternatives, c.text
        texts.append(c.text)
    return texts


def test_constrained_generation_gives_one_of_the_alternatives(llm):
    assert isinstance(llm.engine.structured.backend, ChoiceBackend)
    literal = StructuredOutputsParams(regex=r"yes|no|maybe\?")
    params = [_choice(seed) for seed in range(5)]
    params.append(SamplingParams(temperature=1.0, seed=7, max_tokens=24, structured_outputs=literal))
    outs = llm.generate(["def f(x):"] * len(params), params, use_tqdm=False)
    assert len(set(_assert_constrained(outs[:5], CHOICES))) >= 2
    _assert_constrained(outs[5:], ["yes", "no", "maybe?"])
    assert len(llm.engine.structured) == 0, "grammar state leaked"


def _engine_like(llm, config) -> LLM:
    """An engine for ``config`` on ``llm``'s loaded model and the installed plugins' grammar backends."""
    e = llm.engine
    return LLM.from_engine(
        LLMEngine(config, e.model, e.backends, e.tokenizer, build_registry().structured_backends)
    )


def test_the_environment_variable_selects_it(llm, monkeypatch):
    monkeypatch.setenv("DEEPINFER_STRUCTURED_OUTPUTS_BACKEND", "example_choice")
    chosen = _engine_like(llm, load_config(**KW))
    assert chosen.engine.structured.backend_name == "example_choice"
    _assert_constrained(chosen.generate(["import "], _choice(11), use_tqdm=False), CHOICES)


def test_a_config_file_selects_it(llm, tmp_path):
    cfg = tmp_path / "engine.toml"
    cfg.write_text('[deepinfer]\nstructured_outputs_backend = "example_choice"\n')
    chosen = _engine_like(llm, load_config(cfg, environ={}, **KW))
    assert chosen.engine.structured.backend_name == "example_choice"
    _assert_constrained(chosen.generate(["class A:"], _choice(12), use_tqdm=False), CHOICES)


def test_a_grammar_backend_nobody_registered_fails_at_build_listing_the_installed(llm):
    with pytest.raises(ConfigError, match="structured_outputs_backend='nope' is not installed") as e:
        LLM(structured_outputs_backend="nope", **KW)
    assert "example_choice" in str(e.value)
    with pytest.raises(ConfigError, match="installed grammar backends: none"):
        LLMEngine(
            load_config(structured_outputs_backend="nope", environ={}, **KW),
            llm.engine.model,
            llm.engine.backends,
        )


def test_the_cli_takes_any_grammar_backend_name_and_reports_a_missing_one(capsys):
    from deepinfer_core.cli.main import main

    argv = [
        "generate",
        "x",
        "--backend",
        "example",
        "--structured-outputs-backend",
        "nope",
        "--max-tokens",
        "1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "structured_outputs_backend='nope' is not installed" in err and "example_choice" in err
