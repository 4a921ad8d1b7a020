"""Batched, differentiable versions of the reference ops, for training only.

The reference platform (:mod:`deepinfer_core.ops.reference`) computes one row at a time so that a row rounds the
same whatever else is in the batch; that makes a training step of 16k tokens take minutes. These subclasses
compute the *same formulas* on the whole batch at once (the reference's own row functions where those
broadcast), so the engine's V4.1 modules can be trained with autograd and the trained weights mean the same
thing at inference. They are not batch invariant and not used by the engine; ``tests/tools/test_v41_demo_train.py``
checks a whole V4.1 forward on them against the reference ops.

Only the unquantized KV path is supported (training runs with ``kv_cache_dtype="unquantized"``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.dense import engram_gate_rows
from deepinfer_core.ops.mhc import HCParams, collapse, mix_coefficients
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.reference.attention import ReferenceAttentionOps
from deepinfer_core.ops.reference.dense import (
    ReferenceDenseOps,
    dense_weight,
    rms_norm_rows,
    rope_rows,
    swiglu_rows,
)
from deepinfer_core.ops.reference.moe import ReferenceMoEOps, _normalise, score
from deepinfer_core.ops.weights import ExpertWeights, Weight


def _plain(fmt: object | None) -> None:
    if fmt is not None:
        raise ValueError("the training ops take unquantized KV only (kv_cache_dtype='unquantized')")


def _gather(pool: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``pool[slots]`` with ``-1`` slots masked: ``(rows [T, n, *entry], valid [T, n])``."""
    valid = slots >= 0
    return pool[slots.clamp(min=0)], valid


class TrainDenseOps(ReferenceDenseOps):
    def linear(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        return F.linear(x, dense_weight(weight, x.dtype))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return rms_norm_rows(x, weight, eps)

    def rope(
        self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False
    ) -> torch.Tensor:
        return rope_rows(x, positions, inv_freq, inverse)

    def hc_post(
        self, y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        dtype = y.dtype
        mixed = torch.matmul(comb.to(dtype).transpose(-1, -2), residual)
        return post.to(dtype).unsqueeze(-1) * y.unsqueeze(-2) + mixed

    def swiglu_mlp(self, x: torch.Tensor, w1: Weight, w3: Weight, w2: Weight, limit: float) -> torch.Tensor:
        m1, m3, m2 = (dense_weight(w, x.dtype) for w in (w1, w3, w2))
        return swiglu_rows(x, m1, m3, m2, limit)

    def hc_mixes(self, x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return mix_coefficients(x, hc)

    def hc_collapse(self, x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        return collapse(x, pre)

    def engram_gate(
        self, h: torch.Tensor, key: torch.Tensor, value: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return engram_gate_rows(h, key, value, weight, eps)


class TrainAttentionOps(ReferenceAttentionOps):
    def sparse_attention(
        self,
        q: torch.Tensor,
        kv_pool: torch.Tensor,
        kv_slots: torch.Tensor,
        cmp_pool: torch.Tensor | None,
        cmp_slots: torch.Tensor | None,
        sinks: torch.Tensor,
        scale: float,
        kv_format: object | None = None,
        cmp_format: object | None = None,
    ) -> torch.Tensor:
        _plain(kv_format)
        _plain(cmp_format)
        kv, valid = _gather(kv_pool, kv_slots)
        if cmp_slots is not None:
            ckv, cvalid = _gather(cmp_pool, cmp_slots)
            kv, valid = torch.cat([kv, ckv], dim=1), torch.cat([valid, cvalid], dim=1)
        logits = torch.einsum("thd,tnd->thn", q, kv).float() * scale
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        sink = sinks.float()[None, :, None].expand(q.shape[0], -1, 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        return torch.einsum("thn,tnd->thd", probs.to(kv.dtype), kv).to(q.dtype)

    def indexer_scores(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_pool: torch.Tensor,
        cand_slots: torch.Tensor,
        key_format: object | None = None,
    ) -> torch.Tensor:
        _plain(key_format)
        with torch.no_grad():  # the selection is not differentiable
            keys, valid = _gather(key_pool, cand_slots)
            head = torch.relu(torch.einsum("thd,tcd->thc", q.float(), keys.float()))
            out = (head * weights.float()[:, :, None]).sum(dim=1)
            return out.masked_fill(~valid, float("-inf"))

    def indexer_topk(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_pool: torch.Tensor,
        cand_slots: torch.Tensor,
        topk: int,
        key_format: object | None = None,
    ) -> torch.Tensor:
        k = min(topk, cand_slots.shape[1])
        s = self.indexer_scores(q, weights, key_pool, cand_slots, key_format)
        top = s.topk(k, dim=-1)
        return torch.where(top.values > float("-inf"), top.indices, -1)

    def candidate_blocks(
        self, scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block_size: int
    ) -> torch.Tensor:
        t, width = scores.shape
        n_blocks = -(-width // block_size)
        row = torch.full((t, n_blocks * block_size), float("-inf"), device=scores.device)
        row[:, :width] = scores.float()
        block = row.view(t, n_blocks, block_size).amax(dim=-1)
        last = (visible.long() - 1) // block_size
        pin = (torch.arange(n_blocks, device=scores.device)[None, :] == last[:, None]) & (last[:, None] >= 0)
        block = block.masked_fill(pin, float("inf"))
        top = block.topk(min(topk_blocks, n_blocks), dim=-1)
        keep = torch.zeros_like(block, dtype=torch.bool)
        keep.scatter_(1, top.indices, top.values > float("-inf"))
        return keep.repeat_interleave(block_size, dim=1)[:, :width]

    def compress(
        self,
        kv: torch.Tensor,
        score: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
    ) -> torch.Tensor:
        w = torch.softmax(score.float(), dim=1).to(kv.dtype)
        pooled = (kv * w).sum(dim=1)
        normed = rms_norm_rows(pooled, norm_weight, eps)
        return rope_rows(normed[:, None, :], positions, inv_freq, False)[:, 0]


class TrainMoEOps(ReferenceMoEOps):
    """Also counts each router's expert loads (``loads``: bias tensor id -> counts) for bias balancing."""

    def __init__(self) -> None:
        self.loads: dict[int, torch.Tensor] = {}

    def route_topk(self, logits, correction_bias, top_k, score_func, routed_scaling_factor):
        with torch.no_grad():
            s = score(logits.float(), score_func)
            sel = s if correction_bias is None else s + correction_bias.float()
            ids = torch.topk(sel, top_k, dim=-1).indices
            if correction_bias is not None:
                counts = torch.bincount(ids.flatten(), minlength=logits.shape[-1]).float()
                key = id(correction_bias)
                self.loads[key] = self.loads.get(key, 0) + counts
        return self.route_hash(logits, ids, score_func, routed_scaling_factor), ids

    def route_hash(self, logits, ids, score_func, routed_scaling_factor):
        return _normalise(score(logits.float(), score_func).gather(1, ids.long()), routed_scaling_factor)

    def experts(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        experts: ExpertWeights,
        swiglu_limit: float,
    ) -> torch.Tensor:
        out = torch.zeros_like(x)
        for i, gid in enumerate(experts.expert_ids):
            rows, cols = torch.nonzero(ids == gid, as_tuple=True)
            if rows.numel() == 0:
                continue
            w1, w3, w2 = (dense_weight(w[i], x.dtype) for w in (experts.w1, experts.w3, experts.w2))
            y = swiglu_rows(x[rows], w1, w3, w2, swiglu_limit)
            out = out.index_add(0, rows, y * weights[rows, cols, None].to(y.dtype))
        return out


def train_backends() -> Backends:
    """The batched ops for dense, attention and MoE; the reference's for the rest."""
    return Backends(
        "train",
        dense=TrainDenseOps(),
        attention=TrainAttentionOps(),
        moe=TrainMoEOps(),
        sampling=reference_op("sampling"),
        memory=reference_op("memory"),
        comm=reference_op("comm"),
    )
