"""Hook implementations of the ``ascend950`` plugin (entry point ``ascend950``).

Importing this module imports neither ``torch_npu`` nor any op module: each op hook imports its
module (and, through it, ``torch_npu``) only when the engine is built for ``ascend950``.
"""

from __future__ import annotations

from deepinfer_ascend950.platform import PLATFORM, Ascend950Platform, Ascend950Settings
from deepinfer_core.plugin_api import EngineConfig, hookimpl

DEEPINFER_PLUGIN_API = "2.2"  # act_block / act_input (activation_quant)


def _settings(config: EngineConfig) -> Ascend950Settings:
    return config.platform_settings(PLATFORM, Ascend950Settings)


@hookimpl
def deepinfer_register_platforms(register):
    register(Ascend950Platform())


@hookimpl
def deepinfer_dense_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.dense import AscendDenseOps

    return AscendDenseOps(_settings(config).fused)


@hookimpl
def deepinfer_attention_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.attention import AscendAttentionOps
    from deepinfer_ascend950.ops.dense import AscendDenseOps

    fused = _settings(config).fused
    return AscendAttentionOps(fused, AscendDenseOps(fused))


@hookimpl
def deepinfer_moe_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.moe import AscendMoEOps

    return AscendMoEOps(_settings(config).fused)


@hookimpl
def deepinfer_sampling_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.sampling import AscendSamplingOps

    return AscendSamplingOps(_settings(config).fused)


@hookimpl
def deepinfer_memory_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.memory import AscendMemoryOps

    return AscendMemoryOps(graphs=_settings(config).graphs and not config.enforce_eager)


@hookimpl
def deepinfer_comm_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.comm import AscendCommOps

    return AscendCommOps()
