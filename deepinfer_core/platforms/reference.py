"""The CPU reference platform: pure-PyTorch ops, always available, the embedded default."""

from __future__ import annotations

import platform as _pyplatform
from typing import TYPE_CHECKING

import torch
from pydantic import Field

from deepinfer_core.config import PlatformSettings
from deepinfer_core.ops.reference.memory import ReferenceMemoryOps
from deepinfer_core.platforms.base import Availability, Platform

if TYPE_CHECKING:
    from deepinfer_core.config import EngineConfig
    from deepinfer_core.ops.backends import Backends


class ReferenceSettings(PlatformSettings):
    """The ``reference`` section: ``DEEPINFER_REFERENCE__NUM_THREADS``, ``LLM(reference={...})``, ``[reference]``."""

    num_threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads; the row-wise reference ops gain nothing from more (a loaded "
        "machine made a 128-token prefill of the demo model 100x slower: 57 s against 0.57 s, measured)",
    )
    host_reserve_bytes: int = Field(
        0,
        ge=0,
        description="host memory the KV cache budget leaves free, bytes (the 'device' is host memory)",
    )


class ReferencePlatform(Platform):
    name = "reference"
    priority = 0  # every accelerator platform outranks it
    device_type = "cpu"
    settings_model = ReferenceSettings

    def is_available(self) -> Availability:
        return Availability(
            True, f"CPU ({_pyplatform.machine() or 'unknown arch'}), pure PyTorch reference ops"
        )

    def finalize(self, backends: Backends, config: EngineConfig) -> None:
        """Run torch with ``num_threads`` threads (one by default) and hand the reference memory ops the
        host memory they must leave free."""
        settings = config.platform_settings(self.name, ReferenceSettings)
        torch.set_num_threads(settings.num_threads)
        if isinstance(backends.memory, ReferenceMemoryOps):
            backends.memory.host_reserve_bytes = settings.host_reserve_bytes
