"""CUDA attention ops: sparse shared-KV attention with sinks, indexer scoring, compressor (all Triton)."""

from __future__ import annotations

import torch

from deepinfer_core.ops.attention import AttentionOps
from deepinfer_cuda_sm100.kernels import compressor, indexer, sparse_attention


class CudaAttentionOps(AttentionOps):
    def sparse_attention(self, q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale) -> torch.Tensor:
        return sparse_attention.sparse_attention(q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale)

    def indexer_topk(self, q, weights, key_pool, cand_slots, topk) -> torch.Tensor:
        """Triton scores; selection by ``torch.topk`` on them (a fused top-k kernel is future work)."""
        return indexer.indexer_topk(q, weights, key_pool, cand_slots, topk)

    def compress(self, kv, score, norm_weight, eps, positions, inv_freq) -> torch.Tensor:
        return compressor.compress(kv, score, norm_weight, eps, positions, inv_freq)
