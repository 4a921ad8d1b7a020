"""Plugin loading survives bad plugins, honours the allow-list, versions and hook names."""

from __future__ import annotations

import logging

import pytest

from deepinfer_core.config import load_config
from deepinfer_core.plugins.manager import PluginLoadError, api_compatible
from deepinfer_core.runtime import build_registry, build_runtime
from deepinfer_core.version import PLUGIN_API_VERSION

GOOD = """
from deepinfer_core.plugin_api import Availability, Platform, hookimpl
DEEPINFER_PLUGIN_API = "2.0"
class P(Platform):
    name = "fakeplat"
    priority = -5
    def is_available(self):
        return Availability(True, "always")
@hookimpl
def deepinfer_register_platforms(register):
    register(P())
"""


def test_plugin_that_raises_on_import_is_reported_and_others_still_load(fake_dist, caplog):
    fake_dist("deepinfer-broken", "broken_plugin_mod", "raise RuntimeError('kaboom at import')", "broken")
    fake_dist("deepinfer-good", "good_plugin_mod", GOOD, "good")
    with caplog.at_level(logging.WARNING, logger="deepinfer.plugins"):
        reg = build_registry(allow=["broken", "good"])
    assert "fakeplat" in reg.platforms
    [failed] = reg.report.failed
    assert failed.name == "broken" and failed.dist == "deepinfer-broken"
    assert "kaboom at import" in failed.error
    assert "deepinfer-broken" in caplog.text and "kaboom at import" in caplog.text


def test_strict_plugins_raises_on_a_broken_plugin(fake_dist):
    fake_dist("deepinfer-broken", "broken_plugin_mod2", "import not_a_module_anywhere", "broken2")
    with pytest.raises(PluginLoadError, match="deepinfer-broken.*not_a_module_anywhere"):
        build_registry(allow=["broken2"], strict=True)


def test_engine_still_builds_with_a_broken_plugin(fake_dist):
    fake_dist("deepinfer-broken", "broken_plugin_mod3", "raise ImportError('missing vendor lib')", "broken3")
    rt = build_runtime(load_config(backend="reference", plugins=["broken3"]))
    assert rt.platform.name == "reference"
    assert [f.name for f in rt.registry.report.failed] == ["broken3"]


def test_allow_list_from_env_limits_loading_and_empty_loads_none(fake_dist):
    fake_dist("deepinfer-good", "good_plugin_mod4", GOOD, "good4")
    only = load_config(environ={"DEEPINFER_PLUGINS": "good4"})
    reg = build_registry(allow=only.plugins)
    assert [p.name for p in reg.report.loaded] == ["good4"]
    none = load_config(environ={"DEEPINFER_PLUGINS": ""})
    reg = build_registry(allow=none.plugins)
    assert reg.report.loaded == [] and set(reg.platforms) == {"reference"}


def test_incompatible_plugin_api_is_refused_with_a_clear_message(fake_dist):
    fake_dist("deepinfer-future", "future_plugin_mod", GOOD.replace('"2.0"', '"3.0"'), "future")
    reg = build_registry(allow=["future"])
    [failed] = reg.report.failed
    assert "plugin API 3.0" in failed.error and f"provides {PLUGIN_API_VERSION}" in failed.error
    assert "fakeplat" not in reg.platforms


def test_a_1x_plugin_is_refused_with_what_moved(fake_dist):
    fake_dist("deepinfer-old", "old_plugin_mod", GOOD.replace('"2.0"', '"1.3"'), "old")
    reg = build_registry(allow=["old"])
    [failed] = reg.report.failed
    assert f"built for plugin API 1.3; this core provides {PLUGIN_API_VERSION}, a new major" in failed.error
    assert "deepinfer_core.plugin_api" in failed.error and "docs/plugins.md" in failed.error


@pytest.mark.parametrize(
    "declared, ok",
    [
        ("2.0", True),  # a 2.0 plugin keeps loading on the 2.14 core
        ("2.1", True),
        ("2.2", True),
        ("2.3", True),
        ("2.4", True),
        ("2.5", True),
        ("2.6", True),
        ("2.7", True),
        ("2.8", True),
        ("2.9", True),
        ("2.10", True),
        ("2.11", True),
        ("2.12", True),
        ("2.13", True),
        ("2.14", True),
        ("2.15", False),
        ("1.3", False),
        ("1.0", False),
        ("3.0", False),
        ("0.9", False),
        (None, False),
        ("one", False),
    ],
)
def test_api_compatibility_rule(declared, ok):
    assert api_compatible(declared)[0] is ok


def test_misspelled_hook_is_an_error_not_silence(fake_dist):
    src = GOOD.replace("def deepinfer_register_platforms", "def deepinfer_register_platfroms")
    fake_dist("deepinfer-typo", "typo_plugin_mod", src, "typo")
    reg = build_registry(allow=["typo"])
    [failed] = reg.report.failed
    assert "deepinfer_register_platfroms" in failed.error and "misspelled" in failed.error
    with pytest.raises(PluginLoadError, match="deepinfer_register_platfroms"):
        build_registry(allow=["typo"], strict=True)


def test_duplicate_platform_names_are_rejected(fake_dist):
    fake_dist("deepinfer-a", "dup_a_mod", GOOD, "dupa")
    fake_dist("deepinfer-b", "dup_b_mod", GOOD, "dupb")
    reg = build_registry(allow=["dupa", "dupb"])
    assert reg.platforms.owners["fakeplat"] == "dupa"
    [failed] = reg.report.failed
    assert failed.name == "dupb" and "registered twice: by dupa and by dupb" in failed.error
    with pytest.raises(PluginLoadError, match="registered twice"):
        build_registry(allow=["dupa", "dupb"], strict=True)
