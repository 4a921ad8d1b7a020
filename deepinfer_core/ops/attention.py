"""Attention ops for V4's three attention kinds, over paged KV addressed by slot indices.

The KV pools are flat views ``[num_slots, D]`` of the engine's paged pools; a *slot* is
``block_id * entries_per_block + offset``. The model turns block tables into slot lists; the
op attends each query to exactly the slots it is given. This one contract covers sliding-window
attention (window slots), CSA (window slots + the indexer's top-k compressed slots) and HCA
(window slots + every causal compressed slot). DeepSeek-V4.1 adds the indexer's scores and its candidate
blocks, and reads packed quantized entries (window KV, compressed KV and index keys each in its own format).

Packed pools. ``kv_format``, ``cmp_format`` and ``key_format`` are *KV codecs*: objects with
``pack(values [N, n]) -> [N, row_bytes] uint8`` and ``unpack(rows) -> [N, n]`` (exact, see
:mod:`deepinfer_core.ops.kv_fp8` for V4's FP8 rows and ``deepinfer_core.models.deepseek_v41.kv_formats`` for
V4.1's FP8 / FP4 entries). A pool given with a codec holds its rows as bytes; ``None``: rows of values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from deepinfer_core.ops.fusion_kinds import Fusion
from deepinfer_core.ops.kv_fp8 import Fp8KVFormat


class AttentionOps(ABC):
    #: the ``kv_cache_dtype`` values this platform's :meth:`sparse_attention` and :meth:`store_kv` accept
    #: ("auto": pools in the model dtype; "fp8" / "fp8_e4m3": byte rows, see :mod:`deepinfer_core.ops.kv_fp8`)
    kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    #: the attention :class:`~deepinfer_core.ops.fusions.Fusion` s this backend also has (``indexer_select``)
    fusions: ClassVar[frozenset[Fusion]] = frozenset()
    #: the ops read pools packed by any KV codec (``cmp_format`` and ``key_format`` included), as V4.1's
    #: quantized cache (``kv_cache_dtype="auto"``) needs
    packed_kv: ClassVar[bool] = False

    @abstractmethod
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
        """Shared-KV multi-query attention with a learned sink per head.

        - ``q [T, H, D]``; ``kv_pool [S, D]`` and ``cmp_pool [S2, D]`` hold K = V (one KV head). With
          ``kv_format`` both pools are packed byte rows ``[S, kv_format.row_bytes]`` uint8 instead, read
          as :meth:`Fp8KVFormat.unpack` would; with ``cmp_format`` too, ``cmp_pool`` is read by that codec
          instead (V4.1: FP8 window KV, FP4 compressed KV).
        - ``kv_slots [T, Kw]`` / ``cmp_slots [T, Kc]`` int64 slot ids; ``-1`` marks padding.
        - ``sinks [H]`` float32: an extra logit per head that takes probability mass but has no value.

        ``out[t, h] = sum_j p_j * kv[j]`` with ``p = softmax([q.k_j * scale ..., sinks[h]])`` over the
        valid slots of row ``t`` plus the sink. A row with no valid slot returns zeros. -> ``[T, H, D]``.
        """

    def store_kv(
        self, pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, kv_format: Fp8KVFormat | None
    ) -> None:
        """``pool[slots] = values`` (``[N, D]`` rows), packed by ``kv_format`` when it is given.

        Slots index as torch does: ``-1`` is the pool's last slot, the scratch block that padding rows and
        entries that close nothing in a static batch write to (``deepinfer_core.models.deepseek_v4.addressing``).
        The same holds for the slots of :meth:`write_compressor_state` and ``entry_slots`` of
        :meth:`compress_into`."""
        pool[slots] = values.to(pool.dtype) if kv_format is None else kv_format.pack(values)

    def kv_roundtrip(self, values: torch.Tensor, kv_format) -> torch.Tensor:
        """``values [N, D]`` as a pool of ``kv_format`` (a packed codec) returns them after :meth:`store_kv`, in
        ``values.dtype``: the codec's ``roundtrip``. DeepSeek-V4.1 puts its index queries through the index keys'
        FP4 format this way at every step; a platform may do it in one kernel (plugin API 2.3)."""
        return kv_format.roundtrip(values)

    def encoder_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Bidirectional multi-head attention inside segments (a vision tower's, one segment per image).

        ``q, k, v [T, H, D]`` are the rows of several sequences packed end to end; ``cu_seqlens [S + 1]``
        int64 holds their boundaries (``0 = c_0 < c_1 < ... < c_S = T``). A row of segment ``s`` attends to
        every row of ``s`` and to no other: ``out[t, h] = sum_j softmax_j(q[t, h] . k[j, h] * scale) v[j, h]``
        with the softmax in float32, result in ``q.dtype`` -> ``[T, H, D]``. No mask, no sink, no KV cache.
        This default is torch, one segment at a time; a platform may use a varlen attention kernel."""
        out = torch.empty_like(q)
        bounds = cu_seqlens.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            logits = torch.einsum("qhd,khd->hqk", q[a:b].float(), k[a:b].float()) * scale
            probs = torch.softmax(logits, dim=-1)
            out[a:b] = torch.einsum("hqk,khd->qhd", probs, v[a:b].float()).to(q.dtype)
        return out

    @abstractmethod
    def indexer_topk(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_pool: torch.Tensor,
        cand_slots: torch.Tensor,
        topk: int,
        key_format: object | None = None,
    ) -> torch.Tensor:
        """Lightning-indexer selection.

        ``score[t, c] = sum_h weights[t, h] * relu(q[t, h] . key_pool[cand_slots[t, c]])`` for the valid
        candidates (``cand_slots >= 0``). Returns ``[T, min(topk, C)]`` int64 *column indices into*
        ``cand_slots`` of the highest scores (any order), ``-1`` where a row has fewer valid candidates.
        ``q [T, Hi, Di]``, ``weights [T, Hi]`` float32 (already scaled), ``key_pool [S, Di]`` (packed bytes
        read by ``key_format`` when given).
        """

    def indexer_topk_slots(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_pool: torch.Tensor,
        cand_slots: torch.Tensor,
        topk: int,
        key_format: object | None = None,
    ) -> torch.Tensor:
        """:meth:`indexer_topk`, returning the chosen candidates' *slots* (``cand_slots`` at the chosen columns,
        ``-1`` where a row has fewer valid candidates) in the same order. DeepSeek-V4.1's index query layers
        attend those slots; this default looks them up in torch (four launches), and a platform may do it in its
        select kernel (plugin API 2.4)."""
        cols = self.indexer_topk(q, weights, key_pool, cand_slots, topk, key_format=key_format)
        return torch.where(cols >= 0, cand_slots.gather(1, cols.clamp(min=0)), -1)

    def indexer_scores(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_pool: torch.Tensor,
        cand_slots: torch.Tensor,
        key_format: object | None = None,
    ) -> torch.Tensor:
        """The scores :meth:`indexer_topk` ranks, for every candidate: ``[T, C]`` float32,
        ``score[t, c] = sum_h weights[t, h] * relu(q[t, h] . key[cand_slots[t, c]])`` and ``-inf`` where
        ``cand_slots`` is ``-1`` (V4.1's candidate source scores blocks of them). This default is torch, one
        row at a time; a platform may do it in one launch."""
        out = torch.full(cand_slots.shape, float("-inf"), dtype=torch.float32, device=q.device)
        for t in range(q.shape[0]):
            cols = torch.nonzero(cand_slots[t] >= 0).flatten()
            if cols.numel():
                keys = key_pool.index_select(0, cand_slots[t, cols])
                keys = (keys if key_format is None else key_format.unpack(keys)).float()
                head = torch.relu(torch.matmul(q[t].float(), keys.t()))
                out[t, cols] = (head * weights[t].float()[:, None]).sum(dim=0)
        return out

    def candidate_blocks(
        self, scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block_size: int
    ) -> torch.Tensor:
        """V4.1's candidate pool: ``scores [T, C]`` (column ``c`` is compressed entry ``c``, ``-inf`` where not
        visible), ``visible [T]`` entries each row sees. Column blocks of ``block_size`` score their maximum;
        the block holding a row's newest visible entry (``(visible - 1) // block_size``) is pinned to
        ``+inf``; the top ``min(topk_blocks, blocks)`` blocks with a finite or pinned score are kept ->
        ``[T, C]`` bool, True on every column of a kept block. This default is torch, one row at a time."""
        out = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
        width = scores.shape[1]
        n_blocks = -(-width // block_size)
        for t in range(scores.shape[0]):
            row = torch.full((n_blocks * block_size,), float("-inf"), device=scores.device)
            row[:width] = scores[t].float()
            block = row.view(n_blocks, block_size).amax(dim=-1)
            last = (int(visible[t]) - 1) // block_size
            if last >= 0:
                block[last] = float("inf")
            top = block.topk(min(topk_blocks, n_blocks))
            keep = torch.zeros(n_blocks, dtype=torch.bool, device=scores.device)
            keep[top.indices] = top.values > float("-inf")
            out[t] = keep.repeat_interleave(block_size)[:width]
        return out

    def write_compressor_state(
        self,
        state: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        gate: torch.Tensor,
        ape: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """The compressor's per-token state: ``state [S, 2, C]`` float32 gets, at ``slots [T]``, the rows
        ``kv [T, C]`` and ``gate [T, C] + ape[positions % ratio]`` (``ape [ratio, C]`` float32), both as float32.
        This default is torch; a platform may do it in one launch."""
        score = gate.float() + ape[positions % ape.shape[0]]
        state[slots] = torch.stack([kv.float(), score], dim=1)

    def compress_into(
        self,
        state: torch.Tensor,
        src_slots: torch.Tensor,
        overlap: bool,
        norm_weight: torch.Tensor,
        eps: float,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
        entries: torch.Tensor,
        entry_slots: torch.Tensor,
        kv_format: Fp8KVFormat | None = None,
    ) -> None:
        """Compress ``E`` closing windows straight from the state pool into the entries pool.

        ``src_slots [E, L]`` are state slots (``-1``: empty). Without ``overlap`` row ``l`` of window ``e`` is
        ``state[src_slots[e, l]]`` over all ``C = D`` channels; with ``overlap`` (``L = 2 * ratio``,
        ``C = 2 * D``) the first ``ratio`` rows give channels ``[:D]`` and the last ``ratio`` rows ``[D:]``.
        Empty rows take no weight; a window with no rows at all compresses to zeros. The kv rows are cast to
        the entries' dtype (``kv_format.rope_dtype`` for a packed pool) before :meth:`compress`, whose result is
        stored at ``entry_slots`` by :meth:`store_kv`. This default gathers with torch and calls both."""
        dtype = entries.dtype if kv_format is None else kv_format.rope_dtype
        src = state[src_slots.clamp(min=0)]  # [E, L, 2, C]
        empty = (src_slots < 0)[..., None]
        src_kv = src[:, :, 0].masked_fill(empty, 0.0)
        src_score = src[:, :, 1].masked_fill(empty & ~empty.all(dim=1, keepdim=True), float("-inf"))
        if overlap:
            r, d = src_slots.shape[1] // 2, state.shape[-1] // 2
            src_kv = torch.cat([src_kv[:, :r, :d], src_kv[:, r:, d:]], dim=1)
            src_score = torch.cat([src_score[:, :r, :d], src_score[:, r:, d:]], dim=1)
        out = self.compress(src_kv.to(dtype), src_score, norm_weight, eps, positions, inv_freq)
        self.store_kv(entries, entry_slots, out, kv_format)

    @abstractmethod
    def compress(
        self,
        kv: torch.Tensor,
        score: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
    ) -> torch.Tensor:
        """Compressor for ``E`` closed windows of ``L`` source rows.

        ``kv [E, L, D]``, ``score [E, L, D]`` (gate logits plus position bias; ``-inf`` marks an empty
        slot). Returns ``rope(rms_norm(sum_l softmax_l(score) * kv, norm_weight), positions)`` -> ``[E, D]``,
        softmax in float32 over ``L`` per channel, RoPE as :meth:`DenseOps.rope` at ``positions [E]``.
        """
