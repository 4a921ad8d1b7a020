"""Availability probe and identity of the ``ascend950`` platform."""

from __future__ import annotations

import importlib

from deepinfer_core.plugin_api import Availability, Platform

PLATFORM = "ascend950"


def probe_npu() -> Availability:
    """torch_npu importable and at least one NPU visible; otherwise say which of the two is missing."""
    try:
        torch_npu = importlib.import_module("torch_npu")
    except ImportError as e:
        return Availability(False, f"torch_npu is not importable ({e}); install the Ascend PyTorch adapter")
    import torch

    version = getattr(torch_npu, "__version__", "?")
    npu = getattr(torch, "npu", None)
    if npu is None:
        return Availability(False, f"torch_npu {version} is installed but did not register torch.npu")
    count = npu.device_count()
    if count < 1:
        return Availability(False, f"torch_npu {version} found no NPU device")
    return Availability(True, f"{count} NPU(s): {npu.get_device_name(0)}, torch_npu {version}")


class Ascend950Platform(Platform):
    name = PLATFORM
    priority = 90
    device_type = "npu"

    def is_available(self) -> Availability:
        return probe_npu()
