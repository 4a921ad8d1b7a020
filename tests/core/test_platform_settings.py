"""Platform settings are typed fields of the platform's own section: settable by argument, ``DEEPINFER_*``
variable and config file (merged field by field, in that precedence), checked when the engine is built with
errors naming the field, and handed to the platform, which uses them."""

from __future__ import annotations

import json

import pytest
import torch

from deepinfer_core.cli.main import main
from deepinfer_core.config import ConfigError, load_config
from deepinfer_core.platforms.reference import ReferenceSettings
from deepinfer_core.platforms.settings import bind_settings
from deepinfer_core.runtime import build_registry, build_runtime

ROUTES = ["argument", "environment", "config file"]


def config_via(route: str, section: str, field: str, value, tmp_path, **engine):
    """An engine config setting ``section.field = value`` through ``route`` (and nothing else from outside)."""
    if route == "argument":
        return load_config(environ={}, **engine, **{section: {field: value}})
    if route == "environment":
        raw = str(value).lower() if isinstance(value, bool) else str(value)
        return load_config(environ={f"DEEPINFER_{section.upper()}__{field.upper()}": raw}, **engine)
    text = f"[{section}]\n{field} = {json.dumps(value)}\n"
    (tmp_path / "engine.toml").write_text(text)
    return load_config(tmp_path / "engine.toml", environ={}, **engine)


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("route", ROUTES)
def test_reference_threads_reach_torch_by_every_route(route, tmp_path, restore_threads):
    rt = build_runtime(config_via(route, "reference", "num_threads", 2, tmp_path, backend="reference"))
    assert rt.config.platform_settings("reference", ReferenceSettings).num_threads == 2
    assert torch.get_num_threads() == 2
    build_runtime(load_config(environ={}, backend="reference"))
    assert torch.get_num_threads() == 1  # the default: row-wise ops gain nothing from threads


@pytest.mark.parametrize("route", ROUTES)
def test_reference_host_reserve_reaches_the_kv_budget_by_every_route(route, tmp_path, restore_threads):
    reserve = 1 << 40  # more than any test machine has: the budget drops to zero
    rt = build_runtime(
        config_via(route, "reference", "host_reserve_bytes", reserve, tmp_path, backend="reference")
    )
    assert rt.backends.memory.host_reserve_bytes == reserve
    assert rt.backends.memory.available_kv_bytes(0.9, 0) == 0
    default = build_runtime(load_config(environ={}, backend="reference")).backends.memory
    assert default.host_reserve_bytes == 0 and default.available_kv_bytes(0.9, 0) > 0


def test_sources_merge_field_by_field_in_precedence(tmp_path):
    (tmp_path / "engine.toml").write_text(
        "max_num_seqs = 3\n[reference]\nnum_threads = 4\nhost_reserve_bytes = 9\n"
    )
    env = {"DEEPINFER_REFERENCE__HOST_RESERVE_BYTES": "10", "DEEPINFER_REFERENCE__NUM_THREADS": "5"}
    cfg = load_config(tmp_path / "engine.toml", environ=env, reference={"num_threads": 6})
    settings = cfg.platform_settings("reference", ReferenceSettings)
    assert (cfg.max_num_seqs, settings.num_threads, settings.host_reserve_bytes) == (3, 6, 10)


@pytest.mark.parametrize(
    "kwargs, environ, needle",
    [
        ({"reference": {"num_thread": 2}}, {}, "unknown parameter 'reference.num_thread'; allowed parameters "
                                               "of reference: num_threads, host_reserve_bytes"),
        ({}, {"DEEPINFER_REFERENCE__NUM_THREAD": "2"}, "unknown parameter 'reference.num_thread'"),
        ({"reference": {"num_threads": 0}}, {}, "reference.num_threads=0: Input should be greater than or equal"),
        ({}, {"DEEPINFER_CUDA_SM100__PDL": "maybe"}, "cuda_sm100.pdl='maybe': Input should be a valid boolean"),
        ({"cuda_sm10": {"pdl": False}}, {}, "'cuda_sm10' is not an installed platform (did you mean 'cuda_sm100'?)"),
    ],
)  # fmt: skip
def test_a_bad_section_is_refused_when_the_engine_is_built_naming_it(kwargs, environ, needle):
    cfg = load_config(environ=environ, **kwargs)  # sections are only known once the plugins are
    with pytest.raises(ConfigError, match="invalid engine configuration: .*" + needle.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.").replace("?", r"\?")):  # fmt: skip
        build_runtime(cfg)


def test_a_platform_without_settings_has_no_section():
    reg = build_registry()
    assert reg.platforms["example"].settings_model is None
    with pytest.raises(
        ConfigError, match="settings section 'example' has no settings; platforms with settings: "
    ):
        bind_settings(load_config(environ={}, example={"x": 1}), reg.platforms)


def test_a_section_object_passes_only_its_set_fields():
    cfg = load_config(
        environ={"DEEPINFER_REFERENCE__HOST_RESERVE_BYTES": "7"}, reference=ReferenceSettings(num_threads=3)
    )
    settings = cfg.platform_settings("reference", ReferenceSettings)
    assert (settings.num_threads, settings.host_reserve_bytes) == (3, 7)


def test_plugins_config_prints_every_setting_and_where_it_came_from(tmp_path, monkeypatch, capsys):
    (tmp_path / "engine.toml").write_text("max_num_seqs = 3\n[reference]\nnum_threads = 4\n")
    monkeypatch.setenv("DEEPINFER_PLUGINS", "")
    monkeypatch.setenv("DEEPINFER_REFERENCE__HOST_RESERVE_BYTES", "5")
    assert main(["plugins", "--json", "--config", str(tmp_path / "engine.toml")]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings["engine"]["max_num_seqs"] == {"value": 3, "source": "config file"}
    assert settings["engine"]["plugins"] == {"value": [], "source": "DEEPINFER_PLUGINS"}
    assert settings["engine"]["seed"] == {"value": 0, "source": "default"}
    ref = settings["platforms"]["reference"]
    assert (ref["num_threads"]["value"], ref["num_threads"]["source"]) == (4, "config file")
    assert ref["host_reserve_bytes"]["source"] == "DEEPINFER_REFERENCE__HOST_RESERVE_BYTES"
    assert "threads" in ref["num_threads"]["description"]
    assert main(["plugins", "--config"]) == 0
    out = capsys.readouterr().out
    assert (
        "reference (DEEPINFER_REFERENCE__<FIELD>" in out and "host_reserve_bytes = 5  [DEEPINFER_REF" in out
    )
