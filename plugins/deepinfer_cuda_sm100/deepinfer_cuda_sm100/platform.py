"""Availability probe and identity of the ``cuda_sm100`` platform."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from deepinfer_core.plugin_api import Availability, Platform
from deepinfer_cuda_sm100 import settings
from deepinfer_cuda_sm100.settings import CudaSM100Settings

if TYPE_CHECKING:
    from deepinfer_core.plugin_api import EngineConfig

MIN_CAPABILITY = (9, 0)


def probe_cuda() -> Availability:
    """A CUDA device of compute capability 9.0 or newer, with the device's name and capability."""
    if not torch.cuda.is_available():
        why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        return Availability(
            False, f"{why} (torch {torch.__version__}); cuda_sm100 needs compute capability >= 9.0"
        )
    major, minor = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    if (major, minor) < MIN_CAPABILITY:
        return Availability(False, f"{name} has compute capability {major}.{minor}; cuda_sm100 needs >= 9.0")
    arch = "SM100 paths" if major >= 10 else "SM90 paths (SM100-only kernels disabled)"
    return Availability(True, f"{name}, compute capability {major}.{minor}, {arch}")


class CudaSM100Platform(Platform):
    name = "cuda_sm100"
    priority = 100
    device_type = "cuda"
    settings_model = CudaSM100Settings

    def is_available(self) -> Availability:
        return probe_cuda()

    def finalize(self, backends: object, config: EngineConfig) -> None:
        """The kernels' switches: this engine's settings become the active ones (:mod:`.settings`)."""
        settings.use(config.platform_settings(self.name, CudaSM100Settings))
