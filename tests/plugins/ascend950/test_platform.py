"""Platform logic of ascend950: availability and its reasons, selection by config, the op hooks, the
switches. Runs with torch_npu absent, with the stand-in and zero devices, and with the stand-in."""

from __future__ import annotations

import sys

import pytest
import torch

from deepinfer_ascend950 import plugin
from deepinfer_ascend950._npu import FUSED_DEFAULTS, fused_switches, graphs_enabled
from deepinfer_ascend950.platform import Ascend950Platform
from deepinfer_core.config import load_config
from deepinfer_core.plugins.registry import BackendSelectionError, build_registry, select_platform


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


def test_fused_switches_parse_the_environment():
    assert fused_switches({}) == FUSED_DEFAULTS and FUSED_DEFAULTS["sparse_attention"] is False
    on = fused_switches({"DEEPINFER_ASCEND_FUSED": "+sparse_attention, -rope"})
    assert on["sparse_attention"] and not on["rope"] and on["rms_norm"]
    assert not any(fused_switches({"DEEPINFER_ASCEND_FUSED": "none"}).values())
    assert fused_switches({"DEEPINFER_ASCEND_FUSED": "none,+probs"}) == {
        k: k == "probs" for k in FUSED_DEFAULTS
    }
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        fused_switches({"DEEPINFER_ASCEND_FUSED": "nope"})


def test_graph_switch_follows_enforce_eager_and_the_env_var():
    assert graphs_enabled(False, {}) and not graphs_enabled(True, {})
    assert not graphs_enabled(False, {"DEEPINFER_ASCEND_GRAPHS": "0"})
    assert graphs_enabled(False, {"DEEPINFER_ASCEND_GRAPHS": "1"})
