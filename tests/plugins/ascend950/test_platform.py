"""Platform logic of ascend950: availability and its reasons, selection by config, the op hooks, the
switches. Runs with torch_npu absent, with the stand-in and zero devices, and with the stand-in."""

from __future__ import annotations

import sys

import pytest
import torch

from deepinfer_ascend950 import plugin
from deepinfer_ascend950.platform import FUSED_DEFAULTS, Ascend950Platform, Ascend950Settings
from deepinfer_core.config import load_config
from deepinfer_core.plugins.registry import BackendSelectionError, select_platform
from deepinfer_core.runtime import build_registry


def test_without_torch_npu_the_platform_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ImportError
    a = Ascend950Platform().is_available()
    assert not a.available and a.reason.startswith("torch_npu is not importable")
    with pytest.raises(BackendSelectionError, match=r"'ascend950' is installed but unavailable: torch_npu"):
        select_platform(build_registry(), "ascend950")


def test_deepinfer_plugins_shows_the_unavailable_reason(monkeypatch):
    from deepinfer_core.cli.plugins_cmd import collect

    monkeypatch.setitem(sys.modules, "torch_npu", None)
    mine = next(p for p in collect()["plugins"] if p["name"] == "ascend950")
    assert mine["platforms"]["ascend950"]["available"] is False
    assert "torch_npu is not importable" in mine["platforms"]["ascend950"]["detail"]
    assert "deepinfer_memory_ops" in mine["hooks"] and "deepinfer_attention_ops" in mine["hooks"]


def test_torch_npu_without_devices_is_unavailable_with_reason(standin, monkeypatch):
    monkeypatch.setattr(torch, "npu", standin.make_npu_namespace(devices=0))
    a = Ascend950Platform().is_available()
    assert not a.available and "found no NPU device" in a.reason and standin.__version__ in a.reason


def test_torch_npu_that_registers_no_torch_npu_namespace_is_unavailable(standin, monkeypatch):
    monkeypatch.delattr(torch, "npu")
    assert "did not register torch.npu" in Ascend950Platform().is_available().reason


def test_with_a_device_the_platform_is_available_and_selectable(standin):
    a = Ascend950Platform().is_available()
    assert a.available and "1 NPU(s): Ascend950 (stand-in)" in a.reason
    reg = build_registry()
    assert select_platform(reg, "ascend950").name == "ascend950"
    higher = [n for n, av in reg.availability().items() if av.available and reg.platforms[n].priority > 90]
    assert select_platform(reg, "auto").name == (higher[0] if higher else "ascend950")


def test_backend_config_resolves_every_concern_to_the_ascend_ops(standin):
    from deepinfer_core.runtime import build_runtime

    rt = build_runtime(load_config(backend="ascend950"))
    assert rt.platform.device_type == "npu"
    assert rt.backends.describe() == {
        "dense": "AscendDenseOps",
        "attention": "AscendAttentionOps",
        "moe": "AscendMoEOps",
        "sampling": "AscendSamplingOps",
        "memory": "AscendMemoryOps",
        "comm": "AscendCommOps",
    }
    assert rt.backends.comm.dist_backend == "hccl"
    assert rt.backends.memory.device == torch.device("cpu")  # the stand-in maps the device to cpu


def test_op_hooks_decline_other_platforms():
    cfg = load_config()
    for concern in ("dense", "attention", "moe", "sampling", "memory", "comm"):
        assert getattr(plugin, f"deepinfer_{concern}_ops")(platform="reference", config=cfg) is None


def _fused(**env: str) -> dict[str, bool]:
    environ = {f"DEEPINFER_ASCEND950__{k.upper()}": v for k, v in env.items()}
    return load_config(environ=environ).platform_settings("ascend950", Ascend950Settings).fused


def test_fused_switches_parse_the_setting():
    assert _fused() == FUSED_DEFAULTS and FUSED_DEFAULTS["sparse_attention"] is False
    on = _fused(fused="+sparse_attention, -rope")
    assert on["sparse_attention"] and not on["rope"] and on["rms_norm"]
    assert not any(_fused(fused="none").values())
    assert _fused(fused="none,+probs") == {k: k == "probs" for k in FUSED_DEFAULTS}
    assert Ascend950Settings(fused={"rope": False}).fused == {**FUSED_DEFAULTS, "rope": False}
    with pytest.raises(ValueError, match=r"ascend950\.fused=.*unknown op 'nope'"):
        _fused(fused="nope")


def test_graph_switch_follows_enforce_eager_and_the_setting(standin):
    def graphs(eager: bool, **env: str) -> bool:
        environ = {f"DEEPINFER_ASCEND950__{k.upper()}": v for k, v in env.items()}
        return plugin.deepinfer_memory_ops(
            "ascend950", load_config(environ=environ, enforce_eager=eager)
        ).graphs

    assert graphs(False) and not graphs(True)
    assert not graphs(False, graphs="0") and graphs(False, graphs="1")


@pytest.mark.parametrize("route", ["argument", "environment", "config file"])
def test_settings_reach_every_op_by_every_route(standin, tmp_path, route):
    from deepinfer_core.runtime import build_runtime

    if route == "argument":
        cfg = load_config(environ={}, backend="ascend950", ascend950={"fused": "all", "graphs": False})
    elif route == "environment":
        env = {"DEEPINFER_ASCEND950__FUSED": "all", "DEEPINFER_ASCEND950__GRAPHS": "false"}
        cfg = load_config(environ=env, backend="ascend950")
    else:
        (tmp_path / "engine.toml").write_text(
            'backend = "ascend950"\n[ascend950]\nfused = "all"\ngraphs = false\n'
        )
        cfg = load_config(tmp_path / "engine.toml", environ={})
    ops = build_runtime(cfg).backends
    everything = dict.fromkeys(FUSED_DEFAULTS, True)
    assert ops.dense.fused == ops.attention.fused == ops.moe.fused == ops.sampling.fused == everything
    assert ops.memory.graphs is False and ops.memory.capture_graph(lambda: None) is None
