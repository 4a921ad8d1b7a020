"""Lazy access to torch_npu and the device this platform runs on.

Nothing here imports ``torch_npu`` at module import time: :func:`torch_npu` does it on first use, from
inside a hook or an op. The plugin's switches are its settings (:class:`~deepinfer_ascend950.platform.Ascend950Settings`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

#: Set by a stand-in module (tests) to run the ops on another device type, e.g. ``"cpu"``.
STANDIN_DEVICE_ATTR = "_deepinfer_device_type"


def torch_npu() -> ModuleType:
    """``import torch_npu`` (which also registers ``torch.npu``); raises ImportError when it is missing."""
    return importlib.import_module("torch_npu")


def device_type() -> str:
    """``"npu"``, or what a stand-in torch_npu declares in ``_deepinfer_device_type``."""
    return getattr(torch_npu(), STANDIN_DEVICE_ATTR, None) or "npu"


def device() -> torch.device:
    """The current NPU (``npu:<current_device>``); ``cpu`` under a stand-in that says so."""
    kind = device_type()
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, torch.npu.current_device())
