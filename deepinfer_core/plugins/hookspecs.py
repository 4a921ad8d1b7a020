"""Hook specifications: everything a plugin can contribute to DeepInfer.

Conventions (read before writing a plugin):

- Every hook name starts with ``deepinfer_``; implement them with ``@deepinfer_core.hookimpl``.
- Registration hooks receive a ``register`` callback instead of returning lists, so the order of
  plugins never matters and one plugin can register several things.
- Op hooks are ``firstresult``: return an object for the platform you own, ``None`` otherwise.
- Hooks run **once**, while the engine is built (:func:`deepinfer_core.plugins.resolve.resolve_backends`
  and friends). The step loop only sees the plain objects they produced.
- The module that an entry point names declares ``DEEPINFER_PLUGIN_API = "MAJOR.MINOR"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deepinfer_core.plugins.markers import hookspec

if TYPE_CHECKING:
    from deepinfer_core.config import EngineConfig
    from deepinfer_core.ops.attention import AttentionOps
    from deepinfer_core.ops.comm import CommOps
    from deepinfer_core.ops.dense import DenseOps
    from deepinfer_core.ops.memory import MemoryOps
    from deepinfer_core.ops.moe import MoEOps
    from deepinfer_core.ops.sampling import SamplingOps
    from deepinfer_core.platforms.base import Platform


# ---------------------------------------------------------------- platforms


@hookspec
def deepinfer_register_platforms(register: Callable[[Platform], None]) -> None:
    """Register platforms (named device targets).

    :param register: call ``register(platform)`` with a :class:`~deepinfer_core.platforms.base.Platform`
        instance for each platform this plugin provides. Names must be unique across plugins.

    Called once when the plugin registry is built, before any backend is resolved.
    """


# ---------------------------------------------------------------- ops, one hook per concern


@hookspec(firstresult=True)
def deepinfer_dense_ops(platform: str, config: EngineConfig) -> DenseOps | None:
    """Provide the dense ops (linear, RMSNorm, RoPE, mHC, SwiGLU) for ``platform``.

    :param platform: the selected platform's name.
    :param config: the engine configuration.
    :return: a :class:`~deepinfer_core.ops.dense.DenseOps`, or ``None`` if this plugin does not
        serve ``platform`` (the next plugin, then the reference ops, are used).

    Called once when an engine is built. Stops at the first non-``None`` result.
    """


@hookspec(firstresult=True)
def deepinfer_attention_ops(platform: str, config: EngineConfig) -> AttentionOps | None:
    """Provide the attention ops (sparse shared-KV attention with sinks, indexer top-k, compressor)
    for ``platform``. Same contract as :func:`deepinfer_dense_ops`."""


@hookspec(firstresult=True)
def deepinfer_moe_ops(platform: str, config: EngineConfig) -> MoEOps | None:
    """Provide the MoE ops (routing, expert GEMMs, EP dispatch/combine) for ``platform``.
    Same contract as :func:`deepinfer_dense_ops`."""


@hookspec(firstresult=True)
def deepinfer_sampling_ops(platform: str, config: EngineConfig) -> SamplingOps | None:
    """Provide the sampling ops (penalties, top-k/top-p/min-p, sampling, argmax, bitmask,
    rejection sampling) for ``platform``. Same contract as :func:`deepinfer_dense_ops`."""


@hookspec(firstresult=True)
def deepinfer_memory_ops(platform: str, config: EngineConfig) -> MemoryOps | None:
    """Provide the memory ops (device, KV pool allocation, pinned buffers, graph capture) for
    ``platform``. Same contract as :func:`deepinfer_dense_ops`."""


@hookspec(firstresult=True)
def deepinfer_comm_ops(platform: str, config: EngineConfig) -> CommOps | None:
    """Provide the communication ops (collectives over ``torch.distributed``) for ``platform``.
    Same contract as :func:`deepinfer_dense_ops`."""


# ---------------------------------------------------------------- decoding features and models


@hookspec
def deepinfer_register_proposers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register speculative-decoding proposers.

    :param register: call ``register(method, factory)``; ``method`` is the ``speculative_config["method"]``
        value (``"mtp"``, ``"ngram"`` ...); ``factory(model, spec_config, engine_config)`` returns a proposer.

    Called once when the registry is built; the factory runs when an engine with a matching
    ``speculative_config`` is built.
    """


@hookspec
def deepinfer_register_structured_backends(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register structured-output (grammar) backends.

    :param register: call ``register(name, factory)``; ``name`` is a ``structured_outputs_backend`` value
        (``"xgrammar"``, ``"llguidance"``); ``factory(tokenizer, vocab_size)`` returns a grammar backend.
        The engine also passes ``stop_token_ids=`` (the model's EOS ids; V4's ``tokenizer.json`` names none)
        and ``cache=`` (the process-wide compile cache) when the factory's signature accepts them.

    Called once when the registry is built; the factory runs when the engine is built.
    """


@hookspec
def deepinfer_register_models(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register model architectures.

    :param register: call ``register(architecture, model_class)``; ``architecture`` is matched against
        ``config.json``'s ``architectures`` list (or ``model_type``), ``model_class`` implements
        :class:`~deepinfer_core.models.base.CausalLM`.

    Called once when the registry is built. The core registers ``DeepseekV4ForCausalLM`` itself.
    """
