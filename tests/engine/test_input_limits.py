"""Smaller holes, each with a clear error: ``n`` is capped by ``max_n``; a lone surrogate is refused naming
where it is; an invalid ``config.json`` names its file; the CLI prints one line, never a traceback, for
user errors; a misspelled ``DEEPINFER_*`` variable is warned about; an unknown plugin name in the
allow-list is an error naming it."""

from __future__ import annotations

import json
import logging

import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.cli.main import main
from deepinfer_core.config import ConfigError, load_config
from deepinfer_core.sampling_params import InvalidParameterError

from .conftest import make_toy_llm

OK = {"prompt_token_ids": [5, 6, 7]}


def test_n_is_capped_by_max_n():
    llm = make_toy_llm(max_n=4)
    with pytest.raises(InvalidParameterError, match=r"n=5 is invalid: must be <= max_n=4"):
        llm.generate([OK], SamplingParams(n=5, temperature=1.0), use_tqdm=False)
    assert (
        len(llm.generate([OK], SamplingParams(n=4, temperature=1.0, max_tokens=2), use_tqdm=False)[0].outputs)
        == 4
    )
    with pytest.raises(InvalidParameterError, match=r"n=1000000 is invalid: must be <= max_n=128"):
        make_toy_llm().generate([OK], SamplingParams(n=10**6, temperature=1.0), use_tqdm=False)


def test_a_lone_surrogate_is_refused_naming_where_it_is():
    llm = make_toy_llm()
    with pytest.raises(
        InvalidParameterError, match=r"prompts\[1\]=.* must be valid Unicode: a lone surrogate at index 3"
    ):
        llm.generate(["abc", "abc\ud800def"], use_tqdm=False)
    with pytest.raises(InvalidParameterError, match=r"stop=.* must be valid Unicode"):
        SamplingParams(stop=["x\udfff"])
    with pytest.raises(ValueError, match=r"messages\[0\]\.content must be valid Unicode"):
        llm.chat([{"role": "user", "content": "hi\ud83d"}], use_tqdm=False)
    assert not llm.engine.requests


def test_an_invalid_config_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"], ')
    with pytest.raises(ConfigError, match=r"config\.json is not valid JSON: Expecting"):
        LLM(str(tmp_path))


def test_the_cli_prints_one_line_for_user_errors(tmp_path, capsys):
    (tmp_path / "config.json").write_text("not json")
    assert main(["generate", "hello", "--model", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "is not valid JSON" in err
    with pytest.raises(SystemExit, match=r"--input-file .*missing\.jsonl' does not exist"):
        main(["generate", "--input-file", str(tmp_path / "missing.jsonl"), "--no-progress"])
    bad = tmp_path / "engine.yaml"
    bad.write_text("max_num_seqs: [1,\n")
    assert main(["generate", "hi", "--config", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "engine.yaml" in err and "is not valid YAML" in err


def test_an_unknown_deepinfer_variable_is_warned_about_with_the_likely_field(caplog):
    with caplog.at_level(logging.WARNING, logger="deepinfer.config"):
        cfg = load_config(
            environ={"DEEPINFER_MAX_NUM_SEQ": "4", "DEEPINFER_CUDA_SM100__PDL": "0", "OTHER": "1"}
        )
    assert cfg.max_num_seqs == 64  # the typo is not a setting
    assert (
        "ignoring unknown environment variable DEEPINFER_MAX_NUM_SEQ; did you mean DEEPINFER_MAX_NUM_SEQS?"
        in caplog.text
    )
    assert "DEEPINFER_CUDA_SM100__PDL" not in caplog.text  # a platform's setting, checked by the platform


def test_an_unknown_plugin_in_the_allow_list_is_an_error_naming_it():
    with pytest.raises(
        ValueError,
        match=r"names 'nosuchplugin', which no installed plugin is called; installed plugins: .*structured",
    ):
        LLM(plugins=["nosuchplugin"])
    with pytest.raises(ValueError, match="nosuchplugin"):
        LLM(**json.loads('{"plugins": ["structured", "nosuchplugin"]}'))
