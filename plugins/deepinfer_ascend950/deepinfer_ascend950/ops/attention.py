"""Attention ops on the NPU over slot-addressed KV pools.

Our contract hands each query row its own slot list. The fused operators take KV either as dense
per-batch sequences (BSND) or through block tables (PA_BSND), so each row's slots are first gathered
into a per-row sequence (``B = rows``, ``S = slots``); rows are processed in chunks so the gathered
copy stays under :data:`GATHER_BUDGET` bytes. That copy is what a slot-native call would save; it needs
block tables in the contract (see docs/platforms/ascend950.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_ascend950._npu import torch_npu
from deepinfer_ascend950.ops.dense import AscendDenseOps
from deepinfer_core.plugin_api import AttentionOps

HALF = (torch.bfloat16, torch.float16)
GATHER_BUDGET = 256 << 20
SFA_HEAD_DIM, SFA_ROPE_DIM = 512, 64  # npu_sparse_flash_attention: D of query/key 512, of the rope parts 64
LI_HEAD_DIM = 128  # npu_lightning_indexer: D of query and key
LI_HEADS = (8, 16, 24, 32, 64)  # npu_lightning_indexer on Ascend 950: query N
LI_COUNTS = frozenset(range(1, 2049)) | {3072, 4096, 5120, 6144, 7168, 8192}  # sparse_count


def row_chunks(rows: int, bytes_per_row: int, budget: int = GATHER_BUDGET) -> list[slice]:
    step = max(1, budget // max(1, bytes_per_row))
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)] or [slice(0, 0)]


def gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``pool[slots]`` with padding (``-1``) read as slot 0; callers mask those columns."""
    return pool.index_select(0, slots.clamp(min=0).flatten()).view(*slots.shape, pool.shape[-1])


def valid_first(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, n_valid)``: a stable permutation of each row putting valid columns first, and their count."""
    order = torch.sort((~valid).to(torch.uint8), dim=-1, stable=True).indices
    return order, valid.sum(dim=-1)


class AscendAttentionOps(AttentionOps):
    def __init__(self, fused: dict[str, bool], dense: AscendDenseOps):
        self.fused = fused
        self.dense = dense

    # ------------------------------------------------------------------ sparse attention

    def sparse_attention(self, q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, kv_format=None):
        """Pools in the model dtype only (``kv_cache_dtypes`` is ``("auto",)``): ``kv_format`` is always ``None``."""
        slots, pools = [kv_slots], [kv_pool]
        if cmp_slots is not None and cmp_pool is not None:
            slots.append(cmp_slots)
            pools.append(cmp_pool)
        t, h, d = q.shape
        width = sum(s.shape[1] for s in slots)
        out = torch.zeros_like(q)
        if t == 0 or width == 0:
            return out
        use_sfa = self._sfa_ok(q, pools)
        for rows in row_chunks(t, width * d * q.element_size() * (2 if use_sfa else 1)):
            kv = torch.cat([gather(p, s[rows]) for p, s in zip(pools, slots)], dim=1)
            valid = torch.cat([s[rows] >= 0 for s in slots], dim=1)
            attend = self._sfa if use_sfa else self._attend
            out[rows] = attend(q[rows], kv, valid, sinks, scale)
        return out

    def _sfa_ok(self, q: torch.Tensor, pools: list[torch.Tensor]) -> bool:
        return (
            self.fused["sparse_attention"]
            and q.dtype in HALF
            and q.shape[-1] == SFA_HEAD_DIM
            and 1 <= q.shape[1] <= 128
            and all(p.dtype == q.dtype for p in pools)
        )

    @staticmethod
    def _attend(q, kv, valid, sinks, scale):
        """Plain torch: ``softmax([q.k * scale ..., sink])`` over the valid slots, sink column dropped."""
        logits = torch.einsum("thd,tkd->thk", q, kv).float() * scale
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        sink = sinks.float().to(q.device)[None, :, None].expand(q.shape[0], -1, 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        return torch.einsum("thk,tkd->thd", probs.to(kv.dtype), kv).to(q.dtype)

    @staticmethod
    def _sfa(q, kv, valid, sinks, scale):
        """``npu_sparse_flash_attention`` with ``attention_mode=2`` (MLA-absorb: K = V = ``kv``, the whole
        512-dim head as the "nope" part, all-zero 64-dim rope parts that add nothing to ``q.k``), layouts
        BSND with ``B`` = rows, one query and one KV head, ``sparse_mode=0`` (no extra mask): each row
        attends to the gathered columns listed in ``sparse_indices``, valid ones first, ``-1`` after."""
        t, h, _ = q.shape
        k = kv.shape[1]
        order, n_valid = valid_first(valid)
        idx = torch.where(torch.arange(k, device=q.device)[None, :] < n_valid[:, None], order, -1)
        out = torch_npu().npu_sparse_flash_attention(
            q[:, None].contiguous(),
            kv[:, :, None],
            kv[:, :, None],
            idx.to(torch.int32)[:, None, None, :].contiguous(),
            scale,
            query_rope=q.new_zeros(t, 1, h, SFA_ROPE_DIM),
            key_rope=kv.new_zeros(t, k, 1, SFA_ROPE_DIM),
            layout_query="BSND",
            layout_kv="BSND",
            sparse_mode=0,
            attention_mode=2,
            sinks=sinks.float().to(q.device),
        )[0][:, 0]
        return torch.where((n_valid > 0)[:, None, None], out, torch.zeros_like(out))

    # ------------------------------------------------------------------ indexer

    def indexer_topk(self, q, weights, key_pool, cand_slots, topk):
        t, c = cand_slots.shape
        k_out = min(topk, c)
        out = torch.full((t, k_out), -1, dtype=torch.int64, device=q.device)
        if t == 0 or k_out == 0:
            return out
        fused = self._li_ok(q, key_pool, k_out)
        for rows in row_chunks(t, c * key_pool.shape[-1] * key_pool.element_size() * (2 if fused else 1)):
            select = self._lightning if fused else self._select
            out[rows] = select(q[rows], weights[rows], key_pool, cand_slots[rows], k_out)
        return out

    def _li_ok(self, q, key_pool, k_out) -> bool:
        return (
            self.fused["indexer_topk"]
            and q.dtype in HALF
            and key_pool.dtype == q.dtype
            and q.shape[-1] == LI_HEAD_DIM
            and q.shape[1] in LI_HEADS
            and k_out in LI_COUNTS
        )

    @staticmethod
    def _select(q, weights, key_pool, cand, k_out):
        """Plain torch, float32: ``sum_h w[h] * relu(q[h] . key)`` per candidate, top-k of the valid ones."""
        keys = gather(key_pool, cand).float()
        score = (F.relu(torch.einsum("thd,tcd->thc", q.float(), keys)) * weights.float()[..., None]).sum(1)
        score = score.masked_fill(cand < 0, float("-inf"))
        vals, cols = torch.topk(score, k_out, dim=-1)
        return torch.where(vals > float("-inf"), cols, -1)

    @staticmethod
    def _lightning(q, weights, key_pool, cand, k_out):
        """``npu_lightning_indexer`` over BSND sequences (``B`` = rows, ``S1 = 1``, one key head) whose
        keys are the row's valid candidates packed first, ``actual_seq_lengths_key`` = their count and
        ``sparse_mode=0``; ``weights`` go in q's dtype (Ascend 950 takes no float32 weights). The output
        positions are mapped back to candidate columns; positions at or past ``min(k, valid)`` are -1."""
        order, n_valid = valid_first(cand >= 0)
        packed = cand.gather(1, order)
        keys = gather(key_pool, packed)
        idx = (
            torch_npu()
            .npu_lightning_indexer(
                q[:, None].contiguous(),
                keys[:, :, None].contiguous(),
                weights.to(q.dtype)[:, None].contiguous(),
                actual_seq_lengths_key=n_valid.to(torch.int32),
                layout_query="BSND",
                layout_key="BSND",
                sparse_count=k_out,
                sparse_mode=0,
            )[0][:, 0, 0]
            .long()
        )
        pos = torch.arange(k_out, device=q.device)[None, :]
        ok = (pos < n_valid[:, None]) & (idx >= 0) & (idx < n_valid[:, None])
        return torch.where(ok, order.gather(1, idx.clamp(0, cand.shape[1] - 1)), -1)

    # ------------------------------------------------------------------ compressor

    def compress(self, kv, score, norm_weight, eps, positions, inv_freq):
        """Softmax pooling in plain torch (float32 softmax over ``L``), then the dense ops' fused
        ``npu_rms_norm`` and ``npu_rotary_mul``: there is no torch_npu operator for V4's compressor."""
        w = torch.softmax(score.float(), dim=1).to(kv.dtype)
        pooled = (kv * w).sum(dim=1)
        normed = self.dense.rms_norm(pooled, norm_weight, eps)
        return self.dense.rope(normed[:, None, :], positions, inv_freq)[:, 0]
