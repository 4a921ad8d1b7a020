"""Hook implementations of the ``ascend950`` plugin (entry point ``ascend950``).

Importing this module imports neither ``torch_npu`` nor any op module: each op hook imports its
module (and, through it, ``torch_npu``) only when the engine is built for ``ascend950``.
"""

from __future__ import annotations

from deepinfer_ascend950.platform import PLATFORM, Ascend950Platform
from deepinfer_core.plugin_api import hookimpl

DEEPINFER_PLUGIN_API = "2.0"


def _fused() -> dict[str, bool]:
    from deepinfer_ascend950._npu import fused_switches

    return fused_switches()


@hookimpl
def deepinfer_register_platforms(register):
    register(Ascend950Platform())


@hookimpl
def deepinfer_dense_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.dense import AscendDenseOps

    return AscendDenseOps(_fused())


@hookimpl
def deepinfer_attention_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.attention import AscendAttentionOps
    from deepinfer_ascend950.ops.dense import AscendDenseOps

    fused = _fused()
    return AscendAttentionOps(fused, AscendDenseOps(fused))


@hookimpl
def deepinfer_moe_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.moe import AscendMoEOps

    return AscendMoEOps(_fused())


@hookimpl
def deepinfer_sampling_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.sampling import AscendSamplingOps

    return AscendSamplingOps(_fused())


@hookimpl
def deepinfer_memory_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950._npu import graphs_enabled
    from deepinfer_ascend950.ops.memory import AscendMemoryOps

    return AscendMemoryOps(graphs=graphs_enabled(config.enforce_eager))


@hookimpl
def deepinfer_comm_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_ascend950.ops.comm import AscendCommOps

    return AscendCommOps()
