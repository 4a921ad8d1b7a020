"""Reference attention ops in pure PyTorch: one query row (or one compression window) at a time.

Each row gathers exactly its own valid slots, so its arithmetic (shapes included) depends on nothing but
that row: results are bit-identical whatever else is in the call (see :mod:`.dense` for why the
row loop is needed on the CPU). Cost: a Python loop over rows, ~30-60 us per row at test sizes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_core.ops.attention import AttentionOps
from deepinfer_core.ops.kv_fp8 import KV_CACHE_DTYPES, Fp8KVFormat
from deepinfer_core.ops.reference.dense import rms_norm_rows, rope_rows


def _gather(
    pool: torch.Tensor | None, slots: torch.Tensor | None, kv_format: object | None = None
) -> torch.Tensor | None:
    if pool is None or slots is None:
        return None
    valid = slots[slots >= 0]
    if not valid.numel():
        return None
    rows = pool.index_select(0, valid)
    return rows if kv_format is None else kv_format.unpack(rows)


class ReferenceAttentionOps(AttentionOps):
    kv_cache_dtypes = KV_CACHE_DTYPES
    packed_kv = True

    def sparse_attention(
        self,
        q: torch.Tensor,
        kv_pool: torch.Tensor,
        kv_slots: torch.Tensor,
        cmp_pool: torch.Tensor | None,
        cmp_slots: torch.Tensor | None,
        sinks: torch.Tensor,
        scale: float,
        kv_format: Fp8KVFormat | None = None,
        cmp_format: object | None = None,
    ) -> torch.Tensor:
        out = torch.zeros_like(q)
        cmp_format = kv_format if cmp_format is None else cmp_format
        for t in range(q.shape[0]):
            parts = [_gather(kv_pool, kv_slots[t], kv_format)]
            if cmp_slots is not None:
                parts.append(_gather(cmp_pool, cmp_slots[t], cmp_format))
            kv = [p for p in parts if p is not None]
            if kv:
                out[t] = self._attend_row(q[t].clone(), torch.cat(kv), sinks, scale)
        return out

    @staticmethod
    def _attend_row(q: torch.Tensor, kv: torch.Tensor, sinks: torch.Tensor, scale: float) -> torch.Tensor:
        """``q [H, D]``, ``kv [n, D]`` (K = V) -> ``[H, D]``; the sink takes mass but carries no value."""
        logits = torch.matmul(q, kv.t()).float() * scale
        logits = torch.cat([logits, sinks.float()[:, None]], dim=-1)
        probs = torch.softmax(logits, dim=-1)[:, :-1]
        return torch.matmul(probs.to(kv.dtype), kv).to(q.dtype)

    def encoder_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        segment = torch.bucketize(torch.arange(q.shape[0]), cu_seqlens, right=True) - 1
        for t in range(q.shape[0]):
            a, b = int(cu_seqlens[segment[t]]), int(cu_seqlens[segment[t] + 1])
            logits = torch.einsum("hd,khd->hk", q[t].float(), k[a:b].float()) * scale
            probs = torch.softmax(logits, dim=-1)
            out[t] = torch.einsum("hk,khd->hd", probs, v[a:b].float()).to(q.dtype)
        return out

    def indexer_topk(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_pool: torch.Tensor,
        cand_slots: torch.Tensor,
        topk: int,
        key_format: object | None = None,
    ) -> torch.Tensor:
        k_out = min(topk, cand_slots.shape[1])
        out = torch.full((q.shape[0], k_out), -1, dtype=torch.int64, device=q.device)
        for t in range(q.shape[0]):
            cols = torch.nonzero(cand_slots[t] >= 0).flatten()
            if cols.numel() == 0:
                continue
            keys = _gather(key_pool, cand_slots[t, cols], key_format).float()
            scores = F.relu(torch.matmul(q[t].float(), keys.t()))  # [Hi, n]
            score = (scores * weights[t].float()[:, None]).sum(dim=0)
            k = min(k_out, cols.numel())
            out[t, :k] = cols[torch.topk(score, k).indices]
        return out

    def compress(
        self,
        kv: torch.Tensor,
        score: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
    ) -> torch.Tensor:
        out = kv.new_empty(kv.shape[0], kv.shape[2])
        for e in range(kv.shape[0]):
            w = torch.softmax(score[e].float(), dim=0).to(kv.dtype)
            pooled = (kv[e].clone() * w).sum(dim=0, keepdim=True)
            normed = rms_norm_rows(pooled, norm_weight, eps)
            out[e] = rope_rows(normed[:, None, :], positions[e : e + 1], inv_freq, False)[0, 0]
        return out
