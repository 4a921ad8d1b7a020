"""Lazy access to torch_npu, the device this platform runs on, and the plugin's switches.

Nothing here imports ``torch_npu`` at module import time: :func:`torch_npu` does it on first use, from
inside a hook or an op. Two environment variables steer the plugin (see ``docs/platforms/ascend950.md``):

- ``DEEPINFER_ASCEND_FUSED``: comma-separated ``+name`` / ``-name`` entries that switch one op's fused
  torch_npu path on or off (``all`` / ``none`` set every op). The defaults are in :data:`FUSED_DEFAULTS`.
- ``DEEPINFER_ASCEND_GRAPHS``: ``0`` disables ACL graph capture of decode steps (as ``enforce_eager``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch

FUSED_ENV = "DEEPINFER_ASCEND_FUSED"
GRAPHS_ENV = "DEEPINFER_ASCEND_GRAPHS"

#: Which ops take their fused torch_npu path by default. ``sparse_attention`` is off: the page of
#: ``npu_sparse_flash_attention`` gives no formula for ``sinks`` (see docs/platforms/ascend950.md).
FUSED_DEFAULTS: dict[str, bool] = {
    "rms_norm": True,
    "rope": True,
    "hc_pre": True,
    "hc_post": True,
    "sparse_attention": False,
    "indexer_topk": True,
    "route_topk": True,
    "experts": True,
    "probs": True,
}

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


def fused_switches(environ: dict[str, str] | None = None) -> dict[str, bool]:
    """:data:`FUSED_DEFAULTS` with ``DEEPINFER_ASCEND_FUSED`` applied; unknown names are errors."""
    env = os.environ if environ is None else environ
    out = dict(FUSED_DEFAULTS)
    for raw in env.get(FUSED_ENV, "").split(","):
        item = raw.strip()
        if not item:
            continue
        if item in ("all", "none"):
            out = dict.fromkeys(out, item == "all")
            continue
        on = not item.startswith("-")
        name = item.lstrip("+-")
        if name not in out:
            raise ValueError(f"{FUSED_ENV}: unknown op {name!r}; known: {', '.join(sorted(out))}, all, none")
        out[name] = on
    return out


def graphs_enabled(enforce_eager: bool, environ: dict[str, str] | None = None) -> bool:
    """Graph capture is on unless ``enforce_eager`` is set or ``DEEPINFER_ASCEND_GRAPHS=0``."""
    env = os.environ if environ is None else environ
    return not enforce_eager and env.get(GRAPHS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
