"""CUDA attention ops: sparse shared-KV attention with sinks (plain or FP8 KV pools), the FP8 KV store, indexer
scoring, compressor (all Triton).

V4.1's packed cache (``packed_kv``: FP8 window KV, FP4 compressed KV and index keys, any codec with
``pack``/``unpack``): the attention kernel decodes V4.1's entry formats as it loads them
(``sparse_attention.packed_layout``); other codecs are unpacked, for the rows each token reads, into plain rows
for it. The indexer's scoring kernel decodes V4.1's FP4 index keys the same way, and one launch packs and stores
V4.1's entries (``kv_store.store_v41``) byte for byte as the codec's ``pack``; other codecs pack in torch. All of it has static shapes and no host synchronisation, so V4.1 steps still run as CUDA graphs.
"""

from __future__ import annotations

import torch

from deepinfer_core.plugin_api import KV_CACHE_DTYPES, AttentionOps, Fp8KVFormat, Fusion
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import (
    compressor,
    indexer,
    kv_store,
    norm_rope,
    sparse_attention,
    static_plan,
)


def _codec(fmt) -> bool:
    """A packed-cache codec other than V4's FP8 entry format (which the kernels read directly)."""
    return fmt is not None and not isinstance(fmt, Fp8KVFormat)


def _unpacked(pool: torch.Tensor, slots: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``slots [T, n]`` of a packed pool unpacked into a plain pool of their own (``T * n`` rows), and
    the slots into it (``-1``, no entry, kept)."""
    t, n = slots.shape
    rows = fmt.unpack(pool.index_select(0, slots.clamp(min=0).flatten()))
    own = torch.arange(t * n, device=slots.device).view(t, n)
    return rows, torch.where(slots >= 0, own, -1)


def _distinct_unpacked(pool: torch.Tensor, slots: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows that ``slots [T, n]`` name in a packed pool, each unpacked once into a plain pool of
    their own, and the slots into it (``-1`` kept). A prefill chunk's tokens read mostly the same entries (an
    8k chunk: ~8k distinct compressed entries among its 4M top-k reads), so this unpacks about ``T`` rows where
    :func:`_unpacked` would unpack ``T * n`` and the kernel's in-register decoding decodes each read again for
    every head block. The distinct slots are marked in a table of the pool's rows (no sort: an indexer's 8k x 4k
    candidate table is 33M slots) and numbered in order by a running count; reading them out synchronises with
    the host: prefill steps only (never captured)."""
    n = pool.shape[0]
    flat = torch.where(slots >= 0, slots, n).flatten()  # no entry: a row past the pool's, dropped
    mark = torch.zeros(n + 1, dtype=torch.bool, device=slots.device)
    mark[flat] = True
    mark = mark[:n]
    distinct = mark.nonzero().squeeze(1)
    number = torch.cumsum(mark, 0) - 1  # a marked row's place among the distinct ones
    inverse = number[flat.clamp(max=n - 1)].view(slots.shape)
    rows = fmt.unpack(pool.index_select(0, distinct))
    return rows, torch.where(slots >= 0, inverse, -1)


def _prefill(q: torch.Tensor) -> bool:
    """A step of :data:`dispatch.UNPACK_DISTINCT_ROWS` query rows or more that is not being captured: its packed
    entries are unpacked once each (:func:`_distinct_unpacked`) before the plain kernels."""
    return dispatch.attention_unpack_distinct(q.shape[0]) and not (
        q.is_cuda and torch.cuda.is_current_stream_capturing()
    )


class CudaAttentionOps(AttentionOps):
    kv_cache_dtypes = KV_CACHE_DTYPES
    fusions = frozenset(
        {
            Fusion.INDEXER_SELECT,
            Fusion.SPARSE_ATTENTION_UNROPE,
            Fusion.ROPE_SPARSE_ATTENTION_UNROPE,
            Fusion.RMS_NORM_ROPE_STORE_KV,
            Fusion.INDEX_QUERY,
            Fusion.STATIC_PLAN,
        }
    )
    packed_kv = True

    def sparse_attention(self, q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, kv_format=None,
                         cmp_format=None, unrope=None, rope_q=False, q_norm_eps=None):  # fmt: skip
        """V4's pools (plain or FP8) straight into the kernel, except FP8 pools in a prefill chunk (unpacked once per
        distinct entry, :func:`_distinct_unpacked`); packed codecs (V4.1) unpacked first. A compressed
        pool without its own ``cmp_format`` uses ``kv_format`` (DSpark's block rows). ``unrope``, ``rope_q``,
        ``q_norm_eps``: see :meth:`sparse_attention_unrope` and :meth:`rope_sparse_attention_unrope`."""
        rq = dict(unrope=unrope, rope_q=rope_q, q_norm_eps=q_norm_eps)
        cmp_format = kv_format if cmp_format is None else cmp_format
        has_cmp = cmp_pool is not None and cmp_slots is not None
        if isinstance(kv_format, Fp8KVFormat) and not _codec(cmp_format) and _prefill(q):
            # V4's FP8 pools in a prefill chunk: each distinct entry unpacked once (the model dtype, exact), then
            # the plain kernel. Decoding in the kernel decodes every read again for every head block: 2.7-3.2x
            # the plain pool's time on the H200 (v8); the V4.1 codecs' unpack-once route took 241 -> 37 ms (v25)
            kv_pool, kv_slots = _distinct_unpacked(kv_pool, kv_slots, kv_format)
            if has_cmp:
                cmp_pool, cmp_slots = _distinct_unpacked(cmp_pool, cmp_slots, cmp_format)
            kv_format = None
        elif _codec(kv_format) or _codec(cmp_format):
            d = q.shape[-1]
            kv_pack = sparse_attention.packed_layout(kv_format, d)
            cmp_pack = sparse_attention.packed_layout(cmp_format, d) if has_cmp else None
            # a prefill chunk reads mostly the same entries from every row: each distinct one is unpacked once,
            # then the plain kernel runs (bf16 tiles, 64 slots); decode steps decode entries in the kernel
            prefill = _prefill(q)
            if not prefill and kv_pack is not None and (cmp_pack is not None or not has_cmp):
                return sparse_attention.sparse_attention(
                    q,
                    kv_pool,
                    kv_slots,
                    cmp_pool,
                    cmp_slots,
                    sinks,
                    scale,
                    kv_pack=kv_pack,
                    cmp_pack=cmp_pack,
                    **rq,
                )
            unpack = _distinct_unpacked if prefill else _unpacked
            if kv_format is not None:
                kv_pool, kv_slots = unpack(kv_pool, kv_slots, kv_format)
            if has_cmp and cmp_format is not None:
                cmp_pool, cmp_slots = unpack(cmp_pool, cmp_slots, cmp_format)
            if cmp_pool is not None and cmp_pool.dtype != kv_pool.dtype:
                cmp_pool = cmp_pool.to(kv_pool.dtype)
            kv_format = None
        return sparse_attention.sparse_attention(
            q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, kv_format, **rq
        )

    def sparse_attention_unrope(self, q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, positions, inv_freq,
                                kv_format=None, cmp_format=None):  # fmt: skip
        """``compose_sparse_attention_unrope``: the output rotated back inside the split-KV combine kernel (decode
        at few rows, where the attention's launches are most of its time), else by one rope launch after it."""
        return self.sparse_attention(q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, kv_format, cmp_format,
                                     unrope=(positions, inv_freq))  # fmt: skip

    def rope_sparse_attention_unrope(self, q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, positions,
                                     inv_freq, kv_format=None, cmp_format=None, *, q_norm_eps=None):  # fmt: skip
        """``compose_rope_sparse_attention_unrope``: the attention kernel norms (``q_norm_eps``) and rotates each
        query row as it loads it (one launch a layer fewer: the query's rope or norm-rope), then
        :meth:`sparse_attention_unrope`."""
        return self.sparse_attention(q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, kv_format, cmp_format,
                                     unrope=(positions, inv_freq), rope_q=True, q_norm_eps=q_norm_eps)  # fmt: skip

    def rms_norm_rope_store_kv(self, x, weight, eps, positions, inv_freq, pool, slots, kv_format) -> None:
        """``compose_rms_norm_rope_store_kv``: into a V4.1 packed pool or a plain pool (V4's bf16 cache) in one
        launch (the norm, the rotation and the pack or the store of each row in one program); otherwise (V4's
        FP8 pools) the norm-rope launch, then :meth:`store_kv`."""
        if _codec(kv_format) and kv_store.v41_store_kind(kv_format, x.shape[-1]) and pool.dim() == 2:
            kv_store.norm_rope_store_v41(pool, slots, x, weight, eps, positions, inv_freq, kv_format)
            return
        plain = pool.dim() == 2 and pool.stride(-1) == 1 and x.dim() == 2 and pool.shape[1] == x.shape[1]
        if kv_format is None and plain:
            norm_rope.rms_norm_rope_store(pool, slots, x, weight, eps, positions, inv_freq)
            return
        rows = norm_rope.rms_norm_rope(x[:, None], weight, eps, positions, inv_freq)[:, 0]
        self.store_kv(pool, slots, rows, kv_format)

    def store_kv(self, pool, slots, values, kv_format) -> None:
        """One Triton launch: a cast copy into plain pools, or the FP8 pack and scatter; packed codecs in torch."""
        if _codec(kv_format):
            if kv_store.v41_store_kind(kv_format, values.shape[-1]) and pool.dim() == 2:
                kv_store.store_v41(pool, slots, values, kv_format)
            else:
                super().store_kv(pool, slots, values, kv_format)
        elif kv_format is None:
            if (
                pool.dim() != 2
                or pool.stride(-1) != 1
                or values.dim() != 2
                or pool.shape[1] != values.shape[1]
            ):
                super().store_kv(pool, slots, values, None)
            else:
                kv_store.store_plain(pool, slots, values)
        else:
            kv_store.store_fp8(pool, slots, values, kv_format)

    def static_plan(self, positions, window_table, compressed_table, rows_per_request, sliding_window, kinds,
                    context_bucket, block_size):  # fmt: skip
        """``compose_static_plan`` in ``1 + len(kinds)`` launches (``kernels.static_plan``) where the composition
        is ~50 kernels: the plan a captured decode step builds with ``device_plan``."""
        return static_plan.static_plan(
            positions,
            window_table,
            compressed_table,
            rows_per_request,
            sliding_window,
            kinds,
            context_bucket,
            block_size,
        )

    def index_query(self, q, weights, weight_scale, positions, inv_freq, key_format):
        """``compose_index_query`` in one launch (``kv_store.index_query``: the rotation, the round trip through
        the keys' format and the weights' scale) for the key formats the store kernel packs and for none: one
        launch a V4.1 index query layer where there were four (rope, round trip, two torch); else the rope
        launch, :meth:`kv_roundtrip`, and the weights in torch."""
        d = q.shape[-1]
        fits = key_format is None or (_codec(key_format) and kv_store.v41_store_kind(key_format, d))
        if q.dim() == 3 and weights.dim() == 2 and fits and d & (d - 1) == 0:
            return kv_store.index_query(q, weights, weight_scale, positions, inv_freq, key_format)
        q = norm_rope.rope(q, positions, inv_freq)
        if key_format is not None:
            q = self.kv_roundtrip(q.reshape(-1, d), key_format).view(q.shape)
        return q, weights.float() * weight_scale

    def kv_roundtrip(self, values, kv_format) -> torch.Tensor:
        """One launch (``kv_store.roundtrip_v41``) for the codecs the store kernel packs; others in torch."""
        if values.dim() == 2 and kv_store.v41_store_kind(kv_format, values.shape[-1]):
            return kv_store.roundtrip_v41(values, kv_format)
        return super().kv_roundtrip(values, kv_format)

    def indexer_topk(self, q, weights, key_pool, cand_slots, topk, key_format=None) -> torch.Tensor:
        """Triton scores (packed keys: :meth:`indexer_scores`), then the select kernel or ``torch.topk`` as
        ``dispatch.indexer_select`` picks."""
        if key_format is None:
            return indexer.indexer_topk(q, weights, key_pool, cand_slots, topk)
        scores = self.indexer_scores(q, weights, key_pool, cand_slots, key_format)
        return indexer.best_columns(scores, cand_slots, topk)

    def indexer_topk_slots(self, q, weights, key_pool, cand_slots, topk, key_format=None) -> torch.Tensor:
        """:meth:`indexer_topk` with the columns mapped to slots in the select kernel (or beside ``torch.topk``),
        in the same order: no torch lookup after it (four launches in each V4.1 index query layer)."""
        if key_format is None:
            scores = indexer.indexer_scores(q, weights, key_pool, cand_slots)
        else:
            scores = self.indexer_scores(q, weights, key_pool, cand_slots, key_format)
        return indexer.best_slots(scores, cand_slots, topk)

    def indexer_select(self, q, weights, weight_scale, key_pool, cand_slots, topk) -> torch.Tensor:
        """:meth:`indexer_topk` with the weights' scaling in the scoring kernel and the slots looked up in the
        select kernel (v12 run 4: five torch launches, ~7 us, a CSA layer at one token)."""
        return indexer.indexer_select(q, weights, weight_scale, key_pool, cand_slots, topk)

    def indexer_scores(self, q, weights, key_pool, cand_slots, key_format=None) -> torch.Tensor:
        """Every candidate's score with no host synchronisation (graph capture): the Triton scoring kernel on
        plain key pools and on V4.1's FP4 index keys (decoded as they are gathered); other packed keys unpacked
        for all candidates at once, in torch. A prefill chunk's candidates are mostly the same entries in every
        row: each distinct one is unpacked once and the kernel reads plain keys (the in-kernel decoding decodes
        every read: an 8k prefill's scores were 47 ms in 5 launches, v25)."""
        if key_format is not None and _prefill(q):
            key_pool, cand_slots = _distinct_unpacked(key_pool, cand_slots, key_format)
            return indexer.indexer_scores(q, weights, key_pool, cand_slots)
        if key_format is None or indexer.key_pack(key_format, q.shape[-1]) is not None:
            return indexer.indexer_scores(q, weights, key_pool, cand_slots, key_format=key_format)
        t, c = cand_slots.shape
        rows = key_pool.index_select(0, cand_slots.clamp(min=0).flatten())
        keys = key_format.unpack(rows).float().view(t, c, -1)
        head = torch.relu(torch.einsum("thd,tcd->thc", q.float(), keys))
        score = (head * weights.float()[:, :, None]).sum(dim=1)
        return score.masked_fill(cand_slots < 0, float("-inf"))

    def candidate_blocks(self, scores, visible, topk_blocks, block_size) -> torch.Tensor:
        """The core default's selection for all rows at once (torch), with no host synchronisation, so a
        V4.1 step can be captured as a graph: block maxima, the block of each row's newest visible entry
        pinned to ``+inf``, the top ``min(topk_blocks, blocks)`` blocks with a score above ``-inf`` kept."""
        t, width = scores.shape
        n_blocks = -(-width // block_size)
        padded = torch.full((t, n_blocks * block_size), float("-inf"), device=scores.device)
        padded[:, :width] = scores.float()
        block = padded.view(t, n_blocks, block_size).amax(dim=-1)
        last = torch.div(visible.to(torch.int64) - 1, block_size, rounding_mode="floor")
        cols = torch.arange(n_blocks, device=scores.device)[None, :]
        block = block.masked_fill((cols == last[:, None]) & (last[:, None] >= 0), float("inf"))
        top = block.topk(min(topk_blocks, n_blocks), dim=-1)
        keep = torch.zeros((t, n_blocks), dtype=torch.bool, device=scores.device)
        keep.scatter_(1, top.indices, top.values > float("-inf"))
        return keep.repeat_interleave(block_size, dim=1)[:, :width]

    def compress(self, kv, score, norm_weight, eps, positions, inv_freq) -> torch.Tensor:
        return compressor.compress(kv, score, norm_weight, eps, positions, inv_freq)

    def write_compressor_state(self, state, slots, kv, gate, ape, positions) -> None:
        compressor.write_state(state, slots, kv, gate, ape, positions)

    def compress_into(self, state, src_slots, overlap, norm_weight, eps, positions, inv_freq, entries, entry_slots,
                      kv_format=None) -> None:  # fmt: skip
        """Gather, compress, norm, RoPE and the cache insert in one launch (two with an FP8 pool: the packing
        store reads the compressed rows back)."""
        args = (state, src_slots, overlap, norm_weight, eps, positions, inv_freq)
        if kv_format is None:
            compressor.compress_from_state(*args, entries, entry_slots)
            return
        rows = torch.empty(
            (src_slots.shape[0], kv_format.head_dim), dtype=kv_format.rope_dtype, device=state.device
        )
        compressor.compress_from_state(*args, rows, None)
        kv_store.store_fp8(entries, entry_slots, rows, kv_format)
