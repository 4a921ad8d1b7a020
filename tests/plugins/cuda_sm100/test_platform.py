"""The cuda_sm100 platform's availability probe, backend selection and hook wiring (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.plugins.registry import BackendSelectionError, build_registry, select_platform
from deepinfer_cuda_sm100 import dispatch, plugin
from deepinfer_cuda_sm100.platform import probe_cuda

from .cuda_sm100_helpers import needs_triton


def _fake_gpu(monkeypatch, capability, name="NVIDIA H200"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)


def test_probe_without_cuda_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a = probe_cuda()
    assert not a.available
    assert "compute capability >= 9.0" in a.reason


def test_probe_rejects_ampere(monkeypatch):
    _fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    a = probe_cuda()
    assert not a.available and "A100" in a.reason and "8.0" in a.reason


@pytest.mark.parametrize(("cap", "text"), [((9, 0), "SM90"), ((10, 0), "SM100")])
def test_probe_accepts_hopper_and_blackwell(monkeypatch, cap, text):
    _fake_gpu(monkeypatch, cap)
    a = probe_cuda()
    assert a.available and text in a.reason


def _registry():
    return build_registry(allow=["cuda_sm100"], extra_plugins=[])


def test_auto_picks_cuda_when_available(monkeypatch):
    _fake_gpu(monkeypatch, (9, 0))
    reg = _registry()
    assert select_platform(reg, "auto").name == "cuda_sm100"


def test_auto_falls_back_to_reference_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_platform(_registry(), "auto").name == "reference"


def test_explicit_backend_unavailable_names_the_reason(monkeypatch):
    _fake_gpu(monkeypatch, (8, 6), "NVIDIA RTX 3090")
    with pytest.raises(BackendSelectionError, match="RTX 3090 has compute capability 8.6"):
        select_platform(_registry(), "cuda_sm100")


def test_op_hooks_ignore_other_platforms():
    for concern in ("dense", "attention", "moe", "sampling", "memory", "comm"):
        assert getattr(plugin, f"deepinfer_{concern}_ops")(platform="reference", config=None) is None


@needs_triton
def test_op_hooks_serve_cuda_sm100():
    from deepinfer_core.ops.backends import CONCERNS

    names = {c: type(getattr(plugin, f"deepinfer_{c}_ops")(platform="cuda_sm100", config=None)).__name__
             for c in CONCERNS if c != "memory"}  # fmt: skip
    assert names == {
        "dense": "CudaDenseOps", "attention": "CudaAttentionOps", "moe": "CudaMoEOps",
        "sampling": "CudaSamplingOps", "comm": "NcclCommOps",
    }  # fmt: skip


def test_dispatch_arch_by_capability(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    dispatch._arch_of.cache_clear()
    _fake_gpu(monkeypatch, (10, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert dispatch.arch() == "sm100"
    dispatch._arch_of.cache_clear()
    _fake_gpu(monkeypatch, (9, 0))
    assert dispatch.arch() == "sm90"
    dispatch._arch_of.cache_clear()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.arch() == "interpreter"


def test_gemm_config_keeps_quant_blocks_aligned(monkeypatch):
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    for rows in (1, 20, 100, 5000):
        for fmt in ("plain", "fp8_block", "fp4_e2m1"):
            cfg = dispatch.gemm_config(rows, 4096, 2048, fmt, gated=rows % 2 == 0)
            assert 128 % cfg.block_k == 0 and cfg.block_k % 64 == 0
            assert cfg.block_m >= 16
