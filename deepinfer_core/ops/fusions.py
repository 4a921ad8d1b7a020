"""Fusions as capabilities: the fused ops a backend may declare, and their resolution into one table.

The op contracts (:class:`~deepinfer_core.ops.dense.DenseOps`, :class:`~deepinfer_core.ops.attention.AttentionOps`)
hold the plain ops. A backend that also has a fused version of some steps lists them in its ``fusions``
(:class:`Fusion` names) and implements each as a method of that name, equal to the core's composition in
:mod:`deepinfer_core.ops.compose`. :func:`resolve_fusions` runs once, when the backends are built, and fixes the
callable of every fused step: the backend's method where declared, else the composition of its plain ops.
The model only ever calls ``backends.fused.<step>``: no version test, no ``hasattr``, per step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from deepinfer_core.ops import compose
from deepinfer_core.ops.fusion_kinds import Fusion

log = logging.getLogger("deepinfer.ops")


COMPOSED: dict[Fusion, Callable[..., Any]] = {
    Fusion.RMS_NORM_ROPE: compose.compose_rms_norm_rope,
    Fusion.HC_PRE_NORM: compose.compose_hc_pre_norm,
    Fusion.HC_POST_PRE: compose.compose_hc_post_pre,
    Fusion.HC_SITE_NORM: compose.compose_hc_site_norm,
    Fusion.HC_POST_SITE_NORM: compose.compose_hc_post_site_norm,
    Fusion.SWIGLU_MLP_ADD: compose.compose_swiglu_mlp_add,
    Fusion.LINEAR_F32: compose.compose_linear_f32,
    Fusion.INDEXER_SELECT: compose.compose_indexer_select,
    Fusion.SPARSE_ATTENTION_UNROPE: compose.compose_sparse_attention_unrope,
    Fusion.ROPE_SPARSE_ATTENTION_UNROPE: compose.compose_rope_sparse_attention_unrope,
    Fusion.RMS_NORM_ROPE_STORE_KV: compose.compose_rms_norm_rope_store_kv,
    Fusion.INDEX_QUERY: compose.compose_index_query,
    Fusion.STATIC_PLAN: compose.compose_static_plan,
}

#: compositions that also take the other concern's ops, by keyword: the attention's output rotated back by the
#: dense ops' rope
ALSO_NEEDS: dict[Fusion, dict[str, str]] = {
    Fusion.SPARSE_ATTENTION_UNROPE: {"dense": "dense"},
    Fusion.ROPE_SPARSE_ATTENTION_UNROPE: {"dense": "dense"},
    Fusion.RMS_NORM_ROPE_STORE_KV: {"dense": "dense"},
    Fusion.INDEX_QUERY: {"dense": "dense"},
}

#: compositions over other fused steps, by keyword: where a backend does not declare the fusion, its composition
#: runs over the steps as resolved (a backend's own fused ``rms_norm_rope`` and ``sparse_attention_unrope``)
OVER_STEPS: dict[Fusion, dict[str, Fusion]] = {
    Fusion.ROPE_SPARSE_ATTENTION_UNROPE: {
        "norm_rope": Fusion.RMS_NORM_ROPE,
        "attend": Fusion.SPARSE_ATTENTION_UNROPE,
    },
    Fusion.RMS_NORM_ROPE_STORE_KV: {"norm_rope": Fusion.RMS_NORM_ROPE},
}


#: an mHC exit-then-entry step, the entry it composes and the keyword its composition takes that entry by: a
#: backend that fuses only the entry gets the composition over its fused entry
EXIT_THEN_ENTRY: dict[Fusion, tuple[Fusion, str]] = {
    Fusion.HC_POST_PRE: (Fusion.HC_PRE_NORM, "pre_norm"),
    Fusion.HC_POST_SITE_NORM: (Fusion.HC_SITE_NORM, "site_norm"),
}


@dataclass(frozen=True)
class FusedOps:
    """The callable of each fused step, fixed once; arguments as the compositions in :mod:`.compose` take them
    after their first (the ops object). ``declared``: the steps a backend runs fused."""

    rms_norm_rope: Callable[..., Any]
    hc_pre_norm: Callable[..., Any]
    hc_post_pre: Callable[..., Any]
    hc_site_norm: Callable[..., Any]
    hc_post_site_norm: Callable[..., Any]
    swiglu_mlp_add: Callable[..., Any]
    linear_f32: Callable[..., Any]
    indexer_select: Callable[..., Any]
    sparse_attention_unrope: Callable[..., Any]
    rope_sparse_attention_unrope: Callable[..., Any]
    rms_norm_rope_store_kv: Callable[..., Any]
    index_query: Callable[..., Any]
    static_plan: Callable[..., Any]
    declared: frozenset[Fusion]


def composition(fusion: Fusion, owners: dict[str, object]) -> Callable[..., Any]:
    """The core's composition of ``fusion`` over the plain ops of ``owners`` (``{"dense": ..., "attention":
    ...}``): its concern's ops first, and any other ops it needs (:data:`ALSO_NEEDS`) by keyword."""
    extra = {kw: owners[concern] for kw, concern in ALSO_NEEDS.get(fusion, {}).items()}
    return partial(COMPOSED[fusion], owners[fusion.concern], **extra)


def declared_fusions(concern: str, ops: object) -> frozenset[Fusion]:
    """``ops.fusions`` as :class:`Fusion` members, each known, of ``concern`` and implemented as a method.

    :raises ValueError: naming the first declaration that is not."""
    out = set()
    for name in getattr(ops, "fusions", frozenset()):
        if name not in {f.value for f in Fusion}:
            known = ", ".join(f.value for f in Fusion if f.concern == concern)
            raise ValueError(
                f"{type(ops).__qualname__}.fusions lists {name!r}, not a fusion; {concern} fusions: {known}"
            )
        fusion = Fusion(name)
        if fusion.concern != concern:
            raise ValueError(
                f"{type(ops).__qualname__}.fusions lists {fusion.value!r}, which {fusion.concern} ops declare"
            )
        if not callable(getattr(ops, fusion.value, None)):
            raise ValueError(
                f"{type(ops).__qualname__} declares the fusion {fusion.value!r} but has no such method"
            )
        out.add(fusion)
    return frozenset(out)


def _note_undeclared(concern: str, ops: object, declared: frozenset[Fusion]) -> None:
    """A method named like a fusion that ``fusions`` does not list is never called: say so once."""
    for fusion in Fusion:
        if (
            fusion.concern == concern
            and fusion not in declared
            and callable(getattr(ops, fusion.value, None))
        ):
            log.warning(
                "deepinfer: %s has a method %r but does not list it in its fusions; the core composes the plain "
                "ops instead", type(ops).__qualname__, fusion.value,
            )  # fmt: skip


def resolve_fusions(dense: object, attention: object) -> FusedOps:
    """The table of fused steps for these ops objects (``None`` stands for ops a test leaves out)."""
    owners = {"dense": dense, "attention": attention}
    declared = {c: declared_fusions(c, ops) if ops is not None else frozenset() for c, ops in owners.items()}
    for concern, ops in owners.items():
        _note_undeclared(concern, ops, declared[concern])
    steps: dict[str, Callable[..., Any]] = {}
    for fusion in Fusion:
        ops = owners[fusion.concern]
        if fusion in declared[fusion.concern]:
            steps[fusion.value] = getattr(ops, fusion.value)
        elif fusion in EXIT_THEN_ENTRY and EXIT_THEN_ENTRY[fusion][0] in declared["dense"]:
            entry, keyword = EXIT_THEN_ENTRY[fusion]  # the exit, then the backend's own fused entry
            steps[fusion.value] = partial(COMPOSED[fusion], ops, **{keyword: steps[entry.value]})
        else:
            over = {kw: steps[step.value] for kw, step in OVER_STEPS.get(fusion, {}).items()}
            steps[fusion.value] = partial(composition(fusion, owners), **over)
    return FusedOps(**steps, declared=declared["dense"] | declared["attention"])
