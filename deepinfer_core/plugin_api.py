"""The plugin API: every name a plugin may import from the core, and nothing else.

A plugin (a platform, a proposer, a grammar backend, a model) imports only from this module::

    from deepinfer_core.plugin_api import AttentionOps, Platform, hookimpl

Everything else in ``deepinfer_core`` is internal and may change in any release. The API is versioned
(:data:`PLUGIN_API_VERSION`, ``MAJOR.MINOR``): a plugin declares the version it was built for as
``DEEPINFER_PLUGIN_API`` in the module its entry point names, and is loaded when the major versions match
and its minor is not newer than the core's. ``docs/plugins.md`` lists these names and the changelog;
``tests/core/test_plugin_api_boundary.py`` checks that every plugin in this repository imports only them.

Names are imported on first use, so importing a plugin's entry-point module stays cheap (a platform plugin
on a machine without its device must not pull in the engine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> (module, attribute): where each name of the API lives today (internal, may move)
_WHERE: dict[str, tuple[str, str]] = {
    "PLUGIN_API_VERSION": ("deepinfer_core.version", "PLUGIN_API_VERSION"),
    "hookimpl": ("deepinfer_core.plugins.markers", "hookimpl"),
    # configuration
    "ConfigError": ("deepinfer_core.config", "ConfigError"),
    "EngineConfig": ("deepinfer_core.config", "EngineConfig"),
    "PlatformSettings": ("deepinfer_core.config", "PlatformSettings"),
    # platforms
    "Availability": ("deepinfer_core.platforms.base", "Availability"),
    "Platform": ("deepinfer_core.platforms.base", "Platform"),
    # ops: one base class per concern, the reference implementations, and their data types
    "AttentionOps": ("deepinfer_core.ops.attention", "AttentionOps"),
    "CommOps": ("deepinfer_core.ops.comm", "CommOps"),
    "TorchDistributedCommOps": ("deepinfer_core.ops.comm", "TorchDistributedCommOps"),
    "DenseOps": ("deepinfer_core.ops.dense", "DenseOps"),
    "MemoryOps": ("deepinfer_core.ops.memory", "MemoryOps"),
    "MoEOps": ("deepinfer_core.ops.moe", "MoEOps"),
    "SamplingOps": ("deepinfer_core.ops.sampling", "SamplingOps"),
    "reference_op": ("deepinfer_core.ops.reference", "reference_op"),
    "Dispatched": ("deepinfer_core.ops.moe", "Dispatched"),
    "EPRouting": ("deepinfer_core.ops.moe", "EPRouting"),
    "ExpertWeights": ("deepinfer_core.ops.weights", "ExpertWeights"),
    "QuantizedWeight": ("deepinfer_core.ops.weights", "QuantizedWeight"),
    "SamplingTensors": ("deepinfer_core.ops.sampling", "SamplingTensors"),
    # keyed randomness (2.8): the module (constants, keys, uniforms, race) and the vectorised verification
    "draws": ("deepinfer_core.ops.draws", ""),
    "keyed_rejection": ("deepinfer_core.ops.sampling", "keyed_rejection"),
    "ScoreFunc": ("deepinfer_core.ops.moe", "ScoreFunc"),
    "Weight": ("deepinfer_core.ops.weights", "Weight"),
    "HCParams": ("deepinfer_core.ops.mhc", "HCParams"),
    # activation quantisation of quantized GEMMs (QuantizedWeight.act_block; DeepSeek-V4.1's release numerics)
    "act_block": ("deepinfer_core.ops.act_quant", "act_block"),
    "act_input": ("deepinfer_core.ops.act_quant", "act_input"),
    # fusions: what a backend may declare, the resolved table, the core's compositions of plain ops
    "Fusion": ("deepinfer_core.ops.fusions", "Fusion"),
    "FusedOps": ("deepinfer_core.ops.fusions", "FusedOps"),
    "compose_hc_post_pre": ("deepinfer_core.ops.compose", "compose_hc_post_pre"),
    "compose_hc_pre_norm": ("deepinfer_core.ops.compose", "compose_hc_pre_norm"),
    "compose_hc_site_norm": ("deepinfer_core.ops.compose", "compose_hc_site_norm"),
    "compose_hc_post_site_norm": ("deepinfer_core.ops.compose", "compose_hc_post_site_norm"),
    "compose_indexer_select": ("deepinfer_core.ops.compose", "compose_indexer_select"),
    "compose_sparse_attention_unrope": ("deepinfer_core.ops.compose", "compose_sparse_attention_unrope"),
    "compose_rms_norm_rope_store_kv": ("deepinfer_core.ops.compose", "compose_rms_norm_rope_store_kv"),
    "compose_index_query": ("deepinfer_core.ops.compose", "compose_index_query"),
    "compose_rope_sparse_attention_unrope": (
        "deepinfer_core.ops.compose",
        "compose_rope_sparse_attention_unrope",
    ),
    "compose_linear_f32": ("deepinfer_core.ops.compose", "compose_linear_f32"),
    "compose_swiglu_mlp_add": ("deepinfer_core.ops.compose", "compose_swiglu_mlp_add"),
    "engram_gate_rows": ("deepinfer_core.ops.dense", "engram_gate_rows"),
    "ENGRAM_GATE_FLOOR": ("deepinfer_core.ops.dense", "ENGRAM_GATE_FLOOR"),
    "compose_rms_norm_rope": ("deepinfer_core.ops.compose", "compose_rms_norm_rope"),
    # the KV cache
    "CacheSpec": ("deepinfer_core.kv.spec", "CacheSpec"),
    "PackedFormat": ("deepinfer_core.kv.packed", "PackedFormat"),
    "E4M3_MAX": ("deepinfer_core.ops.kv_fp8", "E4M3_MAX"),
    "FP8_KV_GROUP": ("deepinfer_core.ops.kv_fp8", "GROUP"),
    "Fp8KVFormat": ("deepinfer_core.ops.kv_fp8", "Fp8KVFormat"),
    "KV_CACHE_DTYPES": ("deepinfer_core.ops.kv_fp8", "KV_CACHE_DTYPES"),
    # models
    "CausalLM": ("deepinfer_core.models.base", "CausalLM"),
    "ForwardBatch": ("deepinfer_core.models.batch", "ForwardBatch"),
    "TailBatch": ("deepinfer_core.models.batch", "TailBatch"),
    # speculative decoding: proposers
    "Draft": ("deepinfer_core.spec_decode.context", "Draft"),
    "DraftSequence": ("deepinfer_core.spec_decode.context", "DraftSequence"),
    "Proposer": ("deepinfer_core.spec_decode.proposer", "Proposer"),
    "ProposerContext": ("deepinfer_core.spec_decode.context", "ProposerContext"),
    "VerifiedRows": ("deepinfer_core.spec_decode.context", "VerifiedRows"),
    # structured outputs: grammar backends
    "CompiledGrammar": ("deepinfer_core.structured.backend", "CompiledGrammar"),
    "GrammarBackend": ("deepinfer_core.structured.backend", "GrammarBackend"),
    "GrammarMatcher": ("deepinfer_core.structured.backend", "GrammarMatcher"),
    "GrammarVocab": ("deepinfer_core.structured.vocab", "GrammarVocab"),
    "StructuredConstraint": ("deepinfer_core.structured.constraint", "StructuredConstraint"),
    "pack_allowed": ("deepinfer_core.structured.bitmask", "pack_allowed"),
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(
            f"deepinfer_core.plugin_api has no name {name!r}; the API is __all__ (docs/plugins.md)"
        )
    module = importlib.import_module(where[0])
    value = getattr(module, where[1]) if where[1] else module  # "": the module itself
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from deepinfer_core.config import ConfigError, EngineConfig  # noqa: F401
    from deepinfer_core.kv.spec import CacheSpec  # noqa: F401
    from deepinfer_core.models.base import CausalLM  # noqa: F401
    from deepinfer_core.models.batch import ForwardBatch  # noqa: F401
    from deepinfer_core.ops.act_quant import act_block, act_input  # noqa: F401
    from deepinfer_core.ops.attention import AttentionOps  # noqa: F401
    from deepinfer_core.ops.comm import CommOps  # noqa: F401
    from deepinfer_core.ops.dense import DenseOps  # noqa: F401
    from deepinfer_core.ops.memory import MemoryOps  # noqa: F401
    from deepinfer_core.ops.moe import MoEOps  # noqa: F401
    from deepinfer_core.ops.sampling import SamplingOps  # noqa: F401
    from deepinfer_core.platforms.base import Availability, Platform  # noqa: F401
    from deepinfer_core.spec_decode.context import (  # noqa: F401
        Draft,
        DraftSequence,
        ProposerContext,
        VerifiedRows,
    )
    from deepinfer_core.spec_decode.proposer import Proposer  # noqa: F401
