"""Hook implementations of the ``cuda_sm100`` plugin (entry point ``cuda_sm100``)."""

from __future__ import annotations

from deepinfer_core import hookimpl
from deepinfer_cuda_sm100.platform import CudaSM100Platform

DEEPINFER_PLUGIN_API = "1.0"
PLATFORM = CudaSM100Platform.name


@hookimpl
def deepinfer_register_platforms(register):
    register(CudaSM100Platform())
