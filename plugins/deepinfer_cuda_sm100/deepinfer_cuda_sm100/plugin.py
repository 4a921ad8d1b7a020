"""Hook implementations of the ``cuda_sm100`` plugin (entry point ``cuda_sm100``).

Op modules (and triton) are imported inside the hooks, only when this platform was selected.
"""

from __future__ import annotations

from deepinfer_core.plugin_api import hookimpl
from deepinfer_cuda_sm100.platform import CudaSM100Platform

DEEPINFER_PLUGIN_API = "2.14"  # static_plan; 2.13: engram_hashes, host_rows_dequant; 2.12: index_query; 2.11: rms_norm_rope_store_kv; 2.10: rope_sparse_attention_unrope; 2.9: sparse_attention_unrope; 2.8: draws, keyed_rejection (keyed sampling); 2.7: swiglu_mlp_add; 2.6: hc_site_norm / hc_post_site_norm; 2.5: SamplingTensors.any_*; 2.4: indexer_topk_slots; 2.3: kv_roundtrip; 2.2: act_*
PLATFORM = CudaSM100Platform.name


@hookimpl
def deepinfer_register_platforms(register):
    register(CudaSM100Platform())


@hookimpl
def deepinfer_dense_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    return CudaDenseOps()


@hookimpl
def deepinfer_attention_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps

    return CudaAttentionOps()


@hookimpl
def deepinfer_moe_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

    return CudaMoEOps()


@hookimpl
def deepinfer_sampling_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_cuda_sm100.ops.sampling import CudaSamplingOps

    return CudaSamplingOps()


@hookimpl
def deepinfer_memory_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_cuda_sm100.ops.memory import CudaMemoryOps

    return CudaMemoryOps()


@hookimpl
def deepinfer_comm_ops(platform, config):
    if platform != PLATFORM:
        return None
    from deepinfer_cuda_sm100.ops.comm import NcclCommOps

    return NcclCommOps()
