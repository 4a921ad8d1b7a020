"""Attention ops for V4's three attention kinds, over paged KV addressed by slot indices.

The KV pools are flat views ``[num_slots, D]`` of the engine's paged pools; a *slot* is
``block_id * entries_per_block + offset``. The model turns block tables into slot lists; the
op attends each query to exactly the slots it is given. This one contract covers sliding-window
attention (window slots), CSA (window slots + the indexer's top-k compressed slots) and HCA
(window slots + every causal compressed slot).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from deepinfer_core.kv.fp8 import Fp8KVFormat


class AttentionOps(ABC):
    #: the ``kv_cache_dtype`` values this platform's :meth:`sparse_attention` and :meth:`store_kv` accept
    #: ("auto": pools in the model dtype; "fp8" / "fp8_e4m3": byte rows, see :mod:`deepinfer_core.kv.fp8`)
    kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)

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
    ) -> torch.Tensor:
        """Shared-KV multi-query attention with a learned sink per head.

        - ``q [T, H, D]``; ``kv_pool [S, D]`` and ``cmp_pool [S2, D]`` hold K = V (one KV head). With
          ``kv_format`` both pools are packed byte rows ``[S, kv_format.row_bytes]`` uint8 instead, read
          as :meth:`Fp8KVFormat.unpack` would.
        - ``kv_slots [T, Kw]`` / ``cmp_slots [T, Kc]`` int64 slot ids; ``-1`` marks padding.
        - ``sinks [H]`` float32: an extra logit per head that takes probability mass but has no value.

        ``out[t, h] = sum_j p_j * kv[j]`` with ``p = softmax([q.k_j * scale ..., sinks[h]])`` over the
        valid slots of row ``t`` plus the sink. A row with no valid slot returns zeros. -> ``[T, H, D]``.
        """

    def store_kv(
        self, pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, kv_format: Fp8KVFormat | None
    ) -> None:
        """``pool[slots] = values`` (``[N, D]`` rows), packed by ``kv_format`` when it is given.

        Every slot is a valid row (padding rows of a static batch write to a scratch slot)."""
        pool[slots] = values.to(pool.dtype) if kv_format is None else kv_format.pack(values)

    @abstractmethod
    def indexer_topk(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        key_pool: torch.Tensor,
        cand_slots: torch.Tensor,
        topk: int,
    ) -> torch.Tensor:
        """Lightning-indexer selection.

        ``score[t, c] = sum_h weights[t, h] * relu(q[t, h] . key_pool[cand_slots[t, c]])`` for the valid
        candidates (``cand_slots >= 0``). Returns ``[T, min(topk, C)]`` int64 *column indices into*
        ``cand_slots`` of the highest scores (any order), ``-1`` where a row has fewer valid candidates.
        ``q [T, Hi, Di]``, ``weights [T, Hi]`` float32 (already scaled), ``key_pool [S, Di]``.
        """

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
