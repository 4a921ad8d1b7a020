"""Configuration: files, environment, explicit values, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from deepinfer_core.config import ConfigError, load_config


@pytest.mark.parametrize(
    "name, text",
    [
        ("c.toml", 'backend = "example"\nmax_num_seqs = 7\n'),
        ("c2.toml", '[deepinfer]\nbackend = "example"\nmax_num_seqs = 7\n'),
        ("c.yaml", "backend: example\nmax_num_seqs: 7\n"),
        ("c.json", json.dumps({"backend": "example", "max_num_seqs": 7})),
    ],
)
def test_config_file_formats(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    cfg = load_config(p, environ={})
    assert cfg.backend == "example" and cfg.max_num_seqs == 7


def test_precedence_file_then_env_then_explicit(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('backend = "from_file"\nseed = 1\nmax_num_seqs = 3\n')
    env = {"DEEPINFER_BACKEND": "from_env", "DEEPINFER_SEED": "2"}
    cfg = load_config(p, environ=env, seed=5)
    assert (cfg.backend, cfg.seed, cfg.max_num_seqs) == ("from_env", 5, 3)


def test_env_types_are_coerced():
    env = {
        "DEEPINFER_ENABLE_PREFIX_CACHING": "false",
        "DEEPINFER_GPU_MEMORY_UTILIZATION": "0.5",
        "DEEPINFER_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 2}',
        "DEEPINFER_PLUGINS": "a, b",
    }
    cfg = load_config(environ=env)
    assert cfg.enable_prefix_caching is False and cfg.gpu_memory_utilization == 0.5
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 2}
    assert cfg.plugins == ["a", "b"]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
        ({"max_num_seqs": 0}, "max_num_seqs=0"),
        ({"dtype": "int3"}, "dtype='int3'"),
        ({"no_such_field": 1}, "unknown parameter 'no_such_field'"),
    ],
)
def test_bad_values_name_the_field(kwargs, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        load_config(environ={}, **kwargs)


def test_structured_outputs_backend_is_any_grammar_backend_name():
    """Which names exist is known only once plugins are loaded: the engine checks them when it is built."""
    assert load_config(environ={}).structured_outputs_backend == "xgrammar"
    cfg = load_config(environ={"DEEPINFER_STRUCTURED_OUTPUTS_BACKEND": " my_grammars "})
    assert cfg.structured_outputs_backend == "my_grammars"
    with pytest.raises(ConfigError, match="structured_outputs_backend=' '"):
        load_config(environ={}, structured_outputs_backend=" ")


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError, match="max_num_seqs"):
        load_config(environ={"DEEPINFER_MAX_NUM_SEQS": "many"})


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "c.ini"
    bad.write_text("x=1")
    with pytest.raises(ConfigError, match="unsupported extension"):
        load_config(bad)
