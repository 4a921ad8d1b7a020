"""DeepInfer core: public API, engine, reference platform and plugin API.

The heavy parts (engine, model code) are imported lazily so that ``import deepinfer_core``
stays cheap for plugins and the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from deepinfer_core.plugins.markers import hookimpl, hookspec
from deepinfer_core.version import PLUGIN_API_VERSION, __version__

if TYPE_CHECKING:  # pragma: no cover
    from deepinfer_core.engine.llm import LLM
    from deepinfer_core.engine.outputs import CompletionOutput, Logprob, RequestOutput
    from deepinfer_core.sampling_params import SamplingParams, StructuredOutputsParams

_LAZY = {
    "LLM": "deepinfer_core.engine.llm",
    "RequestOutput": "deepinfer_core.engine.outputs",
    "CompletionOutput": "deepinfer_core.engine.outputs",
    "Logprob": "deepinfer_core.engine.outputs",
    "SamplingParams": "deepinfer_core.sampling_params",
    "StructuredOutputsParams": "deepinfer_core.sampling_params",
}

__all__ = [
    "LLM",
    "PLUGIN_API_VERSION",
    "CompletionOutput",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "__version__",
    "hookimpl",
    "hookspec",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'deepinfer_core' has no attribute {name!r}")
