"""CSA2 layer roles: what each V4.1 layer computes, owns and reads (``docs/v41_reference.md``, 3.1).

| role | condition | owns | reads |
|---|---|---|---|
| SWA | ratio 0 | its window KV | nothing shared |
| Full | in ``kv_source_layers`` | window KV, a compressor, compressed KV, index keys, an index query | - |
| Reindex | in ``index_source_layers`` only | window KV, an index query | the last Full layer's KV and keys |
| Reuse | ratio > 0, neither | window KV | the last Full layer's KV, the last index source's top-k |

Index sources after ``candidate_source_layer`` select inside its candidate pool. The encoder is every layer up to
the last Full layer; the layers after it (the decoder) compute no state but their window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from deepinfer_core.models.deepseek_v4.config import ModelConfigError

SWA, FULL, REINDEX, REUSE = "swa", "full", "reindex", "reuse"


class RoleFields(Protocol):
    """What the roles are computed from: these fields of
    :class:`~deepinfer_core.models.deepseek_v41.config.DeepseekV41Config` (which imports this module)."""

    num_hidden_layers: int
    compress_ratios: tuple[int, ...]
    kv_source_layers: tuple[int, ...]
    index_source_layers: tuple[int, ...]
    candidate_source_layer: int
    candidate_topk_blocks: int
    candidate_block_size: int
    index_topk: int


@dataclass(frozen=True)
class LayerRole:
    layer: int
    kind: str  # SWA, FULL, REINDEX or REUSE
    ratio: int
    kv_source: int  # the Full layer whose compressed KV and index keys it reads (-1: none)
    index_source: int  # the layer whose top-k it attends with (itself for Full and Reindex; -1: none)
    candidate_source: bool  # publishes the candidate pool
    uses_candidates: bool  # selects inside the candidate pool

    @property
    def owns_query(self) -> bool:
        """It runs an indexer query of its own."""
        return self.kind in (FULL, REINDEX)


def layer_roles(c: RoleFields) -> tuple[LayerRole, ...]:
    """Each backbone layer's role, checked against the rules any config must follow (else
    :class:`ModelConfigError` naming the layer)."""
    out, kv_src, idx_src, ratio_of = [], -1, -1, 0
    cand = c.candidate_source_layer
    for i in range(c.num_hidden_layers):
        r = c.compress_ratios[i]
        full, index = i in c.kv_source_layers, i in c.index_source_layers
        kind = FULL if full else REINDEX if index else REUSE if r else SWA
        if full and (not index or not r):
            raise ModelConfigError(f"config.json: KV source layer {i} must be a compressed index source")
        if full:
            kv_src, ratio_of = i, r
        if index:
            idx_src = i
        if kind != SWA and (kv_src < 0 or idx_src < 0 or r != ratio_of):
            raise ModelConfigError(
                f"config.json: layer {i} (ratio {r}) needs an earlier KV source and index source of its ratio"
            )
        uses = index and 0 <= cand < i
        if uses and r != c.compress_ratios[cand]:
            raise ModelConfigError(f"config.json: layer {i} selects in layer {cand}'s pool at another ratio")
        out.append(LayerRole(i, kind, r, kv_src if r else -1, idx_src if r else -1, i == cand, uses))
    _check_candidates(c)
    bad = [i for i in (*c.kv_source_layers, *c.index_source_layers) if not 0 <= i < c.num_hidden_layers]
    if bad or any(c.compress_ratios[c.num_hidden_layers :]):
        raise ModelConfigError(
            f"config.json: source layers {bad} are not backbone layers, or a DSpark stage has a ratio"
        )
    return tuple(out)


def _check_candidates(c: RoleFields) -> None:
    cand = c.candidate_source_layer
    if cand < 0:
        return
    if cand not in c.index_source_layers:
        raise ModelConfigError(f"config.json: candidate_source_layer {cand} must be an index source")
    blocks, size = c.candidate_topk_blocks, c.candidate_block_size
    if blocks < 1 or size < 1 or (blocks - 1) * size + 1 < c.index_topk:
        raise ModelConfigError(
            f"config.json: a candidate pool of {blocks} blocks of {size} must always hold index_topk="
            f"{c.index_topk} positions: (candidate_topk_blocks - 1) * candidate_block_size + 1 >= index_topk"
        )


def decoder_start(roles: tuple[LayerRole, ...]) -> int | None:
    """The first layer after the last Full layer when some layer follows it (the decoder), else None."""
    last = max((r.layer for r in roles if r.kind == FULL), default=-1)
    return last + 1 if 0 <= last + 1 < len(roles) else None
