"""Fixtures for the ascend950 contract tests: the torch_npu stand-in and the plugin's backends under it.

What these tests check, in one line: the plugin's layouts, argument plumbing and math against the
documented operator semantics, through a plain-torch stand-in of torch_npu on the CPU. They do not run,
and say nothing about, the Ascend kernels themselves.
"""

from __future__ import annotations

import importlib.metadata as md
import sys

import pytest
import torch

from . import torch_npu_standin

if "ascend950" not in {ep.name for ep in md.entry_points(group="deepinfer")}:
    pytest.skip("deepinfer-ascend950 is not installed (run through nox -s tests)", allow_module_level=True)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    """Install the stand-in as ``torch_npu`` and a fresh fake ``torch.npu``; yields the stand-in module."""
    torch_npu_standin.calls.clear()
    torch_npu_standin.npu = torch_npu_standin.make_npu_namespace()
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu_standin)
    monkeypatch.setattr(torch, "npu", torch_npu_standin.npu, raising=False)
    for var in (
        "DEEPINFER_ASCEND950__FUSED",
        "DEEPINFER_ASCEND950__GRAPHS",
        "DEEPINFER_BACKEND",
        "DEEPINFER_PLUGINS",
    ):
        monkeypatch.delenv(var, raising=False)
    yield torch_npu_standin


@pytest.fixture
def all_fused(monkeypatch: pytest.MonkeyPatch, standin):
    """Every fused path switched on, ``sparse_attention`` (off by default) included."""
    monkeypatch.setenv("DEEPINFER_ASCEND950__FUSED", "all")
    return standin


@pytest.fixture
def ascend(all_fused):
    """The ascend950 backends, resolved exactly as an engine would, with every fused path on."""
    from deepinfer_core.testing import backends_for

    return backends_for("ascend950")


@pytest.fixture(scope="session")
def ref():
    """The reference backends (pure PyTorch)."""
    from deepinfer_core.testing import backends_for

    return backends_for("reference")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)
