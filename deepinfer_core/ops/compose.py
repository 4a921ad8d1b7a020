"""The core's compositions of plain ops: the meaning of every fused op, and what runs where a backend has none.

Each function takes the ops object first, then the fused op's arguments. A backend that declares a
:class:`~deepinfer_core.ops.fusions.Fusion` implements a method of the same name and arguments (without the
first) that returns what the composition returns, within the conformance kit's tolerances; it may call the
composition itself for the shapes its kernel does not take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from deepinfer_core.ops.slot_tables import candidate_slots, lookup_slots, with_absent_column

if TYPE_CHECKING:
    from deepinfer_core.ops.attention import AttentionOps
    from deepinfer_core.ops.dense import DenseOps
    from deepinfer_core.ops.mhc import HCParams
    from deepinfer_core.ops.weights import Weight

PreNorm = Callable[[torch.Tensor, "HCParams", torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def compose_rms_norm_rope(
    dense: DenseOps,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
) -> torch.Tensor:
    """``rope(rms_norm(x, weight, eps), positions, inv_freq)`` over ``x [T, H, D]`` (V4's query heads,
    unweighted, and its KV row): the norm's result is rounded to ``x.dtype`` before the rotation."""
    return dense.rope(dense.rms_norm(x, weight, eps), positions, inv_freq)


def compose_hc_pre_norm(
    dense: DenseOps, x: torch.Tensor, hc: HCParams, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sublayer's entry: ``hc_pre(x, hc)`` then ``rms_norm`` of its collapse (``weight``, ``hc.norm_eps``)
    -> ``(normed [T, D] in x.dtype, post [T, N] f32, comb [T, N, N] f32)``."""
    collapsed, post, comb = dense.hc_pre(x, hc)
    return dense.rms_norm(collapsed, weight, hc.norm_eps), post, comb


def compose_hc_post_pre(
    dense: DenseOps,
    y: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    hc: HCParams,
    weight: torch.Tensor,
    pre_norm: PreNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sublayer's exit and the next one's entry: ``h = hc_post(y, residual, post, comb)``, then the entry
    of ``h`` with the next sublayer's ``hc`` and norm ``weight`` -> ``(h [T, N, D], normed, post, comb)``;
    ``h`` is the next exit's residual. ``pre_norm``: the entry to use (default :func:`compose_hc_pre_norm`)."""
    h = dense.hc_post(y, residual, post, comb)
    if pre_norm is None:
        return (h, *compose_hc_pre_norm(dense, h, hc, weight))
    return (h, *pre_norm(h, hc, weight))


SiteNorm = Callable[
    [torch.Tensor, "HCParams", torch.Tensor, torch.Tensor],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
]


def compose_hc_site_norm(
    dense: DenseOps, x: torch.Tensor, hc: HCParams, pre: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """V4.1's single-pass site entry over the streams ``x [T, N, D]``: the site's coefficients ``hc_mixes(x, hc)``
    and its input, the streams collapsed by ``pre [T, N]`` (the site before's) and normed,
    ``rms_norm(hc_collapse(x, pre), weight, hc.norm_eps)`` -> ``(normed [T, D], pre, post, comb)`` (the site's
    own ``pre``, float32, collapses the next site's input)."""
    new_pre, post, comb = dense.hc_mixes(x, hc)
    return dense.rms_norm(dense.hc_collapse(x, pre), weight, hc.norm_eps), new_pre, post, comb


def compose_hc_post_site_norm(
    dense: DenseOps,
    y: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    hc: HCParams,
    pre: torch.Tensor,
    weight: torch.Tensor,
    site_norm: SiteNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A V4.1 sublayer's exit and the next site's entry: ``h = hc_post(y, residual, post, comb)``, then
    :func:`compose_hc_site_norm` of ``h`` -> ``(h [T, N, D], normed, pre, post, comb)``. ``site_norm``: the entry
    to use (default :func:`compose_hc_site_norm`)."""
    h = dense.hc_post(y, residual, post, comb)
    if site_norm is None:
        return (h, *compose_hc_site_norm(dense, h, hc, pre, weight))
    return (h, *site_norm(h, hc, pre, weight))


def compose_swiglu_mlp_add(
    dense: DenseOps, x: torch.Tensor, w1: Weight, w3: Weight, w2: Weight, limit: float, add: torch.Tensor
) -> torch.Tensor:
    """``add + swiglu_mlp(x, w1, w3, w2, limit)`` in ``x.dtype``: the MoE's routed output (``add [T, D]``, already
    rounded to ``x.dtype``) plus its shared expert, each rounded once as the two ops and the add round."""
    return add + dense.swiglu_mlp(x, w1, w3, w2, limit)


def compose_linear_f32(dense: DenseOps, x: torch.Tensor, weight: Weight) -> torch.Tensor:
    """``x @ weight.T`` with a float32 result, ``x`` widened to float32 exactly first (V4's MoE router logits)."""
    return dense.linear(x.float(), weight)


def compose_sparse_attention_unrope(
    attention: AttentionOps,
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_slots: torch.Tensor,
    cmp_pool: torch.Tensor | None,
    cmp_slots: torch.Tensor | None,
    sinks: torch.Tensor,
    scale: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    kv_format: object | None = None,
    cmp_format: object | None = None,
    *,
    dense: DenseOps,
) -> torch.Tensor:
    """``sparse_attention`` (its arguments, then ``positions [T]`` and ``inv_freq``), its output ``[T, H, D]``
    rotated back by ``rope(..., inverse=True)``: V4's and V4.1's attention output, each rounded as the two ops
    round. ``dense`` is the backend's dense ops (the rope)."""
    o = attention.sparse_attention(
        q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale, kv_format=kv_format, cmp_format=cmp_format
    )
    return dense.rope(o, positions, inv_freq, inverse=True)


def compose_rope_sparse_attention_unrope(
    attention: AttentionOps,
    q: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_slots: torch.Tensor,
    cmp_pool: torch.Tensor | None,
    cmp_slots: torch.Tensor | None,
    sinks: torch.Tensor,
    scale: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    kv_format: object | None = None,
    cmp_format: object | None = None,
    *,
    dense: DenseOps,
    q_norm_eps: float | None = None,
    norm_rope: Callable[..., torch.Tensor] | None = None,
    attend: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """The query ``q [T, H, D]`` rotated at ``positions`` (``rope``; with ``q_norm_eps``, after a weightless RMS
    norm of each head: ``rms_norm_rope(q, None, q_norm_eps, ...)``, V4's query), then
    :func:`compose_sparse_attention_unrope` with the other arguments: the whole attention of V4 and V4.1 between
    the query's projection and the output's. ``norm_rope`` / ``attend``: the steps to use (default: their
    compositions; the core passes a backend's own fused steps)."""
    if q_norm_eps is None:
        q = dense.rope(q, positions, inv_freq)
    elif norm_rope is None:
        q = compose_rms_norm_rope(dense, q, None, q_norm_eps, positions, inv_freq)
    else:
        q = norm_rope(q, None, q_norm_eps, positions, inv_freq)
    args = (
        q,
        kv_pool,
        kv_slots,
        cmp_pool,
        cmp_slots,
        sinks,
        scale,
        positions,
        inv_freq,
        kv_format,
        cmp_format,
    )
    if attend is None:
        return compose_sparse_attention_unrope(attention, *args, dense=dense)
    return attend(*args)


def compose_rms_norm_rope_store_kv(
    attention: AttentionOps,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    pool: torch.Tensor,
    slots: torch.Tensor,
    kv_format: object | None,
    *,
    dense: DenseOps,
    norm_rope: Callable[..., torch.Tensor] | None = None,
) -> None:
    """Each token's KV row ``x [T, D]`` normed (``weight``, ``eps``), rotated at ``positions`` and stored at
    ``slots`` of ``pool`` in ``kv_format``: ``store_kv(pool, slots, rms_norm_rope(x[:, None], ...)[:, 0],
    kv_format)``, V4's and V4.1's window KV. ``norm_rope``: the step to use (default its composition; the core
    passes a backend's own fused ``rms_norm_rope``)."""
    args = (x[:, None], weight, eps, positions, inv_freq)
    rows = compose_rms_norm_rope(dense, *args) if norm_rope is None else norm_rope(*args)
    attention.store_kv(pool, slots, rows[:, 0], kv_format)


def compose_index_query(
    attention: AttentionOps,
    q: torch.Tensor,
    weights: torch.Tensor,
    weight_scale: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    key_format: object | None,
    *,
    dense: DenseOps,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V4.1's index query from its projections: the heads ``q [T, H, D]`` rotated at ``positions`` and, under a
    quantized cache (``key_format``), round-tripped through the index keys' format as the keys are
    (``kv_roundtrip``); the head weights ``weights [T, H]`` (any float dtype) as ``weights.float() *
    weight_scale`` -> ``(q [T, H, D] in q's dtype, weights [T, H] float32)``."""
    q = dense.rope(q, positions, inv_freq)
    if key_format is not None:
        q = attention.kv_roundtrip(q.reshape(-1, q.shape[-1]), key_format).view(q.shape)
    return q, weights.float() * weight_scale


def compose_indexer_select(
    attention: AttentionOps,
    q: torch.Tensor,
    weights: torch.Tensor,
    weight_scale: float,
    key_pool: torch.Tensor,
    cand_slots: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """``indexer_topk`` with ``weights.float() * weight_scale`` (``weights [T, Hi]`` in any dtype), its columns
    mapped to their ``cand_slots`` -> ``[T, min(topk, C)]`` slot ids (any order), ``-1`` where a row has fewer
    valid candidates."""
    cols = attention.indexer_topk(q, weights.float() * weight_scale, key_pool, cand_slots, topk)
    return torch.where(cols >= 0, cand_slots.gather(1, cols.clamp(min=0)), -1)


StaticPlanTables = tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
]


def compose_static_plan(
    attention: AttentionOps | None,
    positions: torch.Tensor,
    window_table: torch.Tensor,
    compressed_table: torch.Tensor,
    rows_per_request: int,
    sliding_window: int,
    kinds: tuple[tuple[int, bool], ...],
    context_bucket: int,
    block_size: int,
) -> StaticPlanTables:
    """A static (graph-shaped) step's slot tables built where its batch lives, with tensor ops only: what
    ``StepAddressing.static_on_device`` holds. ``positions [T]`` (int64; ``-1``: a padding row), request
    ``t // rows_per_request`` of row ``t``, its ``window`` and ``compressed`` block tables (int64, ``-1``: no
    block, at least ``context_bucket / block_size`` columns). Returns ``(req [T], token_slots [T], window_slots
    [T, sliding_window], tables)``, ``tables`` a tuple per ``(ratio, overlap)`` of ``kinds``: ``(entry_slots
    [T], entry_positions [T], src_slots [T, 2 ratio if overlap else ratio], cand_slots [T, context_bucket //
    ratio])``, all int64, as :mod:`deepinfer_core.ops.slot_tables` defines them: the window slots of
    positions ``p - sliding_window + 1 .. p``; the entry closing at row ``t`` (``(p + 1) % ratio == 0``, its
    first token ``p + 1 - ratio``; ``-1`` and position 0 where none closes), the window slots of its source
    tokens (from ``ratio`` before its first with ``overlap``) and the compressed slots of the entries the row
    sees (``e < (p + 1) // ratio``, ``-1`` past them; an absent block's read slots are negative)."""
    pos, dev = positions, positions.device
    req = torch.arange(pos.shape[0], device=dev) // rows_per_request
    # each table with a last column of -1: every position outside a table's columns reads it (column -1)
    window, compressed = with_absent_column(window_table), with_absent_column(compressed_table)
    # every window-group position the step reads, in one lookup: its window, then each kind's sources
    w = torch.arange(1 - sliding_window, 1, device=dev)
    window_pos, firsts, p1 = [pos[:, None] + w[None, :]], [], pos + 1
    for ratio, overlap in kinds:
        # an entry closes at this token: e = p1 / r - 1 >= 0, its first token e * r
        live = (p1 % ratio == 0) & (p1 >= ratio)
        first = torch.where(live, p1 - ratio, -1)
        span = torch.arange(-ratio if overlap else 0, ratio, device=dev)
        window_pos.append(torch.where(live[:, None], first[:, None] + span[None, :], -1))
        firsts.append(first)
    widths = [p.shape[1] for p in window_pos]
    looked_up = lookup_slots(window, req[:, None], torch.cat(window_pos, dim=1), block_size, 1)
    window_slots, *sources = (part.contiguous() for part in looked_up.split(widths, dim=1))
    tables = [
        (
            lookup_slots(compressed, req, first, block_size, ratio),
            first.clamp(min=0),
            src,
            candidate_slots(compressed, req, pos, ratio, context_bucket // ratio, block_size),
        )
        for (ratio, overlap), first, src in zip(kinds, firsts, sources, strict=True)
    ]
    return req, window_slots[:, -1].contiguous(), window_slots, tables  # the window's last column: the token
