"""The ``cuda_sm100`` settings of the GPU scripts: A/B runs set them as ``DEEPINFER_CUDA_SM100__<FIELD>``
variables (``device_round.sh``); every other variable stays out of the scripts' engine configs."""

from __future__ import annotations

import os

from deepinfer_core.config import load_config
from deepinfer_cuda_sm100 import settings

PREFIX = "DEEPINFER_CUDA_SM100__"


def cuda_env() -> dict[str, str]:
    """The ``DEEPINFER_CUDA_SM100__*`` variables, as ``load_config(environ=...)`` takes them."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}


def use_env_settings() -> settings.CudaSM100Settings:
    """For scripts that build ops without an engine: the variables' settings become the active ones."""
    active = load_config(environ=cuda_env()).platform_settings("cuda_sm100", settings.CudaSM100Settings)
    settings.use(active)
    return active
