"""The names of the fused ops a backend may declare (:class:`Fusion`), apart from their resolution
(:mod:`deepinfer_core.ops.fusions`), so the op contracts can name them without importing the compositions."""

from __future__ import annotations

from enum import StrEnum


class Fusion(StrEnum):
    """A fused op a backend may declare; its semantics are those of the composition of the same name."""

    #: ``rms_norm`` then ``rope`` (:func:`~deepinfer_core.ops.compose.compose_rms_norm_rope`), dense
    RMS_NORM_ROPE = "rms_norm_rope"
    #: a sublayer's mHC entry and its norm (:func:`~deepinfer_core.ops.compose.compose_hc_pre_norm`), dense
    HC_PRE_NORM = "hc_pre_norm"
    #: a sublayer's mHC exit and the next one's entry (:func:`~deepinfer_core.ops.compose.compose_hc_post_pre`)
    HC_POST_PRE = "hc_post_pre"
    #: V4.1's single-pass mHC site entry: the site's coefficients of the streams and the streams collapsed by the
    #: site before's ``pre``, normed (:func:`~deepinfer_core.ops.compose.compose_hc_site_norm`), dense
    HC_SITE_NORM = "hc_site_norm"
    #: a V4.1 sublayer's mHC exit and the next site's entry
    #: (:func:`~deepinfer_core.ops.compose.compose_hc_post_site_norm`), dense
    HC_POST_SITE_NORM = "hc_post_site_norm"
    #: the shared expert's clamped SwiGLU added to a sublayer's other output (the routed experts') in one pass
    #: (:func:`~deepinfer_core.ops.compose.compose_swiglu_mlp_add`), dense
    SWIGLU_MLP_ADD = "swiglu_mlp_add"
    #: ``linear`` with a float32 result (:func:`~deepinfer_core.ops.compose.compose_linear_f32`), dense
    LINEAR_F32 = "linear_f32"
    #: the indexer's top-k as slot ids (:func:`~deepinfer_core.ops.compose.compose_indexer_select`), attention
    INDEXER_SELECT = "indexer_select"
    #: ``sparse_attention`` then the inverse ``rope`` of its output
    #: (:func:`~deepinfer_core.ops.compose.compose_sparse_attention_unrope`), attention
    SPARSE_ATTENTION_UNROPE = "sparse_attention_unrope"
    #: the query rotated (optionally normed first), ``sparse_attention``, the output rotated back
    #: (:func:`~deepinfer_core.ops.compose.compose_rope_sparse_attention_unrope`), attention
    ROPE_SPARSE_ATTENTION_UNROPE = "rope_sparse_attention_unrope"
    #: a token's KV row normed, rotated and stored in its pool's format
    #: (:func:`~deepinfer_core.ops.compose.compose_rms_norm_rope_store_kv`), attention
    RMS_NORM_ROPE_STORE_KV = "rms_norm_rope_store_kv"
    #: V4.1's index query: rotated, round-tripped through the index keys' format, its head weights scaled to
    #: float32 (:func:`~deepinfer_core.ops.compose.compose_index_query`), attention
    INDEX_QUERY = "index_query"
    #: a static step's slot tables from its positions and block tables, built where they live (the plan a
    #: captured step holds with ``device_plan``; :func:`~deepinfer_core.ops.compose.compose_static_plan`),
    #: attention
    STATIC_PLAN = "static_plan"

    @property
    def concern(self) -> str:
        """The ops object that declares it: ``"dense"`` or ``"attention"``."""
        attention = (
            Fusion.INDEXER_SELECT,
            Fusion.SPARSE_ATTENTION_UNROPE,
            Fusion.ROPE_SPARSE_ATTENTION_UNROPE,
            Fusion.RMS_NORM_ROPE_STORE_KV,
            Fusion.INDEX_QUERY,
            Fusion.STATIC_PLAN,
        )
        return "attention" if self in attention else "dense"
