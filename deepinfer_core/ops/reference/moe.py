"""Reference MoE ops in pure PyTorch, row by row (batch invariant; see :mod:`.dense`).

``experts`` dequantizes each *used* expert once per call, then runs every row that selected it through
the row-wise SwiGLU; a row's contributions are summed in increasing expert-id order, so its result
depends only on its own ids and weights. Cost: ``T * k`` single-row SwiGLUs (~15 us each at test sizes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_core.ops.moe import MoEOps, ScoreFunc
from deepinfer_core.ops.reference.dense import dense_weight, per_row, swiglu_act, swiglu_rows
from deepinfer_core.ops.weights import ExpertWeights


def score(logits: torch.Tensor, score_func: ScoreFunc) -> torch.Tensor:
    """Router scores from float32 logits ``[1, E]``."""
    if score_func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if score_func == "softmax":
        return logits.softmax(dim=-1)
    if score_func == "sigmoid":
        return logits.sigmoid()
    raise ValueError(f"unknown score_func {score_func!r}; expected sqrtsoftplus, softmax or sigmoid")


def _normalise(chosen: torch.Tensor, routed_scaling_factor: float) -> torch.Tensor:
    return chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * routed_scaling_factor


class ReferenceMoEOps(MoEOps):
    activation_quant = True

    def route_topk(
        self,
        logits: torch.Tensor,
        correction_bias: torch.Tensor | None,
        top_k: int,
        score_func: ScoreFunc,
        routed_scaling_factor: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def ids_row(lg: torch.Tensor) -> torch.Tensor:
            s = score(lg.float(), score_func)
            sel = s if correction_bias is None else s + correction_bias.float()
            return torch.topk(sel, top_k, dim=-1).indices

        ids = per_row(ids_row, logits)
        return self.route_hash(logits, ids, score_func, routed_scaling_factor), ids

    def route_hash(
        self, logits: torch.Tensor, ids: torch.Tensor, score_func: ScoreFunc, routed_scaling_factor: float
    ) -> torch.Tensor:
        def row(lg: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            return _normalise(score(lg.float(), score_func).gather(1, i.long()), routed_scaling_factor)

        return per_row(row, logits, ids)

    def experts(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        experts: ExpertWeights,
        swiglu_limit: float,
    ) -> torch.Tensor:
        local = {g: i for i, g in enumerate(experts.expert_ids)}
        contrib: dict[tuple[int, int, int], torch.Tensor] = {}
        for gid in sorted(set(ids.flatten().tolist()) & local.keys()):
            i = local[gid]
            act = swiglu_act(experts.w1[i], experts.w3[i], experts.w2[i])
            w1, w3, w2 = (dense_weight(w[i], x.dtype) for w in (experts.w1, experts.w3, experts.w2))
            rows, cols = torch.nonzero(ids == gid, as_tuple=True)
            weight_first = (
                act[1] > 0
            )  # the release's order: the routing weight scales the down projection's input
            for t, j in zip(rows.tolist(), cols.tolist()):
                w = weights[t, j]
                y = swiglu_rows(
                    x[t : t + 1].clone(), w1, w3, w2, swiglu_limit, act, w if weight_first else None
                )
                contrib[(t, gid, j)] = y if weight_first else y * w.to(y.dtype)
        out = torch.zeros_like(x)
        for key in sorted(contrib):
            out[key[0]] += contrib[key][0]
        return out
