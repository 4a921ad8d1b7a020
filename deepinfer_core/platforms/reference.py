"""The CPU reference platform: pure-PyTorch ops, always available, the embedded default."""

from __future__ import annotations

import platform as _pyplatform

from deepinfer_core.platforms.base import Availability, Platform


class ReferencePlatform(Platform):
    name = "reference"
    priority = 0  # every accelerator platform outranks it
    device_type = "cpu"

    def is_available(self) -> Availability:
        return Availability(
            True, f"CPU ({_pyplatform.machine() or 'unknown arch'}), pure PyTorch reference ops"
        )
