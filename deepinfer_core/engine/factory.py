"""The one place that chooses the engine for a configuration: one process, or data-parallel ranks."""

from __future__ import annotations

from typing import Any

from deepinfer_core.config import EngineConfig
from deepinfer_core.engine.llm_engine import LLMEngine


def build_engine(config: EngineConfig) -> Any:
    """An :class:`LLMEngine`, or with ``data_parallel_size > 1`` a
    :class:`~deepinfer_core.engine.dp_engine.DPEngine` that spawns (or, under torchrun, joins) the ranks."""
    if config.data_parallel_size > 1:
        from deepinfer_core.engine.dp_engine import DPEngine

        return DPEngine.from_config(config)
    return LLMEngine.from_config(config)
