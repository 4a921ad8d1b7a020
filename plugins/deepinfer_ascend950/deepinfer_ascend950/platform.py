"""Availability probe, identity and settings of the ``ascend950`` platform."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from deepinfer_core.plugin_api import Availability, Platform, PlatformSettings

PLATFORM = "ascend950"

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


def parse_switches(value: str) -> dict[str, bool]:
    """``"+name, -name, all, none"`` applied left to right over :data:`FUSED_DEFAULTS`."""
    out = dict(FUSED_DEFAULTS)
    for item in (raw.strip() for raw in value.split(",")):
        if item in ("all", "none"):
            out = dict.fromkeys(out, item == "all")
        elif item:
            out[item.lstrip("+-")] = not item.startswith("-")
    return out


class Ascend950Settings(PlatformSettings):
    """The ``ascend950`` section: ``LLM(ascend950={...})``, ``DEEPINFER_ASCEND950__<FIELD>``, ``[ascend950]``."""

    fused: dict[str, bool] = Field(
        default_factory=lambda: dict(FUSED_DEFAULTS),
        description="which ops take their fused torch_npu path: a mapping of op names to booleans over the "
        "defaults, or a comma list of +op / -op (all, none set every op)",
    )
    graphs: bool = Field(True, description="capture decode steps as ACL graphs (off: as enforce_eager)")

    @field_validator("fused", mode="before")
    @classmethod
    def _switches(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = parse_switches(value)
        elif isinstance(value, Mapping):
            value = {**FUSED_DEFAULTS, **value}
        else:
            return value  # not a mapping: pydantic says so
        unknown = sorted(set(value) - set(FUSED_DEFAULTS))
        if unknown:
            raise ValueError(
                f"unknown op {unknown[0]!r}; known: {', '.join(sorted(FUSED_DEFAULTS))}, all, none"
            )
        return value


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
    settings_model = Ascend950Settings

    def is_available(self) -> Availability:
        return probe_npu()
