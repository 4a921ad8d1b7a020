"""The plugin API: every name a plugin may import from the core, and nothing else.

A plugin (a platform, a proposer, a grammar backend, a model) imports only from this module::

    from deepinfer_core.plugin_api import AttentionOps, Platform, hookimpl

Everything else in ``deepinfer_core`` is internal and may change in any release. The API is versioned
(:data:`PLUGIN_API_VERSION`, ``MAJOR.MINOR``): a plugin declares the version it was built for as
``DEEPINFER_PLUGIN_API`` in the module its entry point names, and is loaded when the major versions match
and its minor is not newer than the core's. ``docs/plugins.md`` lists these names and the changelog;
``tests/core/test_plugin_api_boundary.py`` checks that every plugin in this repository imports only them.
"""

from __future__ import annotations

from deepinfer_core.config import ConfigError, EngineConfig
from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch
from deepinfer_core.ops.attention import AttentionOps
from deepinfer_core.ops.comm import CommOps, TorchDistributedCommOps
from deepinfer_core.ops.dense import DenseOps
from deepinfer_core.ops.kv_fp8 import E4M3_MAX, KV_CACHE_DTYPES, Fp8KVFormat
from deepinfer_core.ops.kv_fp8 import GROUP as FP8_KV_GROUP
from deepinfer_core.ops.memory import MemoryOps
from deepinfer_core.ops.moe import Dispatched, EPRouting, MoEOps, ScoreFunc
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.sampling import SamplingOps, SamplingTensors
from deepinfer_core.ops.weights import ExpertWeights, QuantizedWeight, Weight
from deepinfer_core.platforms.base import Availability, Platform
from deepinfer_core.plugins.markers import hookimpl
from deepinfer_core.spec_decode import DraftSequence, Proposer, ProposerContext, VerifiedRows
from deepinfer_core.structured import CompiledGrammar, GrammarBackend, GrammarMatcher, GrammarVocab
from deepinfer_core.structured.bitmask import pack_allowed
from deepinfer_core.structured.constraint import StructuredConstraint
from deepinfer_core.version import PLUGIN_API_VERSION

__all__ = [
    "PLUGIN_API_VERSION",
    "hookimpl",
    # configuration
    "ConfigError",
    "EngineConfig",
    # platforms
    "Availability",
    "Platform",
    # ops: one base class per concern, the reference implementations, and their data types
    "AttentionOps",
    "CommOps",
    "DenseOps",
    "MemoryOps",
    "MoEOps",
    "SamplingOps",
    "reference_op",
    "TorchDistributedCommOps",
    "Dispatched",
    "EPRouting",
    "ExpertWeights",
    "QuantizedWeight",
    "SamplingTensors",
    "ScoreFunc",
    "Weight",
    # KV cache layout
    "CacheSpec",
    "E4M3_MAX",
    "FP8_KV_GROUP",
    "Fp8KVFormat",
    "KV_CACHE_DTYPES",
    # models
    "CausalLM",
    "ForwardBatch",
    # speculative decoding: proposers
    "DraftSequence",
    "Proposer",
    "ProposerContext",
    "VerifiedRows",
    # structured outputs: grammar backends
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarMatcher",
    "GrammarVocab",
    "StructuredConstraint",
    "pack_allowed",
]
