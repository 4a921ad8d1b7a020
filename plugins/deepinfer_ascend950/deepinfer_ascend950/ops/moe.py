"""MoE ops on the NPU: ``npu_moe_gating_top_k`` for softmax/sigmoid routing, and the dropless token
path ``npu_moe_init_routing_v2`` -> ``npu_grouped_matmul`` (w1, w3) -> clamped SwiGLU -> ``npu_grouped_matmul``
(w2) -> ``npu_moe_finalize_routing``. sqrt-softplus routing and hash-routing weights are plain torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_ascend950._npu import torch_npu
from deepinfer_ascend950.ops.dense import swiglu_act
from deepinfer_ascend950.ops.weights import gmm_weights, plain
from deepinfer_core.plugin_api import ExpertWeights, MoEOps, ScoreFunc, act_block, act_input

HALF = (torch.bfloat16, torch.float16)
GATING_MAX_EXPERTS = 2048  # npu_moe_gating_top_k: last dim of x


def scores(logits: torch.Tensor, score_func: ScoreFunc) -> torch.Tensor:
    if score_func == "sqrtsoftplus":
        return F.softplus(logits.float()).sqrt()
    if score_func == "softmax":
        return logits.float().softmax(dim=-1)
    if score_func == "sigmoid":
        return logits.float().sigmoid()
    raise ValueError(f"unknown score_func {score_func!r}; expected sqrtsoftplus, softmax or sigmoid")


def normalise(chosen: torch.Tensor, routed_scaling_factor: float) -> torch.Tensor:
    return chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * routed_scaling_factor


def local_index(ids: torch.Tensor, expert_ids: list[int]) -> torch.Tensor:
    """Global expert ids ``[T, k]`` -> local indices ``int32``; ids that are not local map to
    ``len(expert_ids)`` (the sentinel group, see :func:`~deepinfer_ascend950.ops.weights.gmm_weights`).
    Pure device work: no host synchronisation."""
    e, size = len(expert_ids), max(expert_ids) + 1
    lut = torch.full((size,), e, dtype=torch.int32, device=ids.device)
    lut[torch.tensor(expert_ids, device=ids.device)] = torch.arange(e, dtype=torch.int32, device=ids.device)
    ids = ids.long()
    inside = (ids >= 0) & (ids < size)
    return torch.where(inside, lut[ids.clamp(0, size - 1)], e)


class AscendMoEOps(MoEOps):
    activation_quant = True  # on the torch path (the fused NPU routing is skipped for marked experts)

    def __init__(self, fused: dict[str, bool]):
        self.fused = fused

    def route_topk(self, logits, correction_bias, top_k, score_func, routed_scaling_factor):
        """``npu_moe_gating_top_k(x, k, bias, k_group=1, group_count=1, norm_type=0|1)`` selects by
        ``norm(x) + bias`` and returns the unbiased ``norm(x)`` of the chosen experts (renormalised only for
        sigmoid); we renormalise and scale both, as the contract says."""
        e = logits.shape[-1]
        if self.fused["route_topk"] and score_func in ("softmax", "sigmoid") and 2 < e <= GATING_MAX_EXPERTS:
            bias = None if correction_bias is None else correction_bias.float()
            y, ids, _ = torch_npu().npu_moe_gating_top_k(
                logits.float(),
                top_k,
                bias=bias,
                k_group=1,
                group_count=1,
                group_select_mode=0,
                renorm=0,
                norm_type=0 if score_func == "softmax" else 1,
                out_flag=False,
                routed_scaling_factor=1.0,
                eps=1e-20,
            )
            return normalise(y.float(), routed_scaling_factor), ids.long()
        s = scores(logits, score_func)
        sel = s if correction_bias is None else s + correction_bias.float()
        ids = torch.topk(sel, top_k, dim=-1).indices
        return normalise(s.gather(1, ids), routed_scaling_factor), ids

    def route_hash(self, logits, ids, score_func, routed_scaling_factor):
        return normalise(scores(logits, score_func).gather(1, ids.long()), routed_scaling_factor)

    def experts(self, x, ids, weights, experts: ExpertWeights, swiglu_limit):
        if x.shape[0] == 0 or experts.num_local_experts == 0:
            return torch.zeros_like(x)
        if self.fused["experts"] and x.dtype in HALF and not act_block(experts.w2[0]):
            return self._fused_experts(x, ids, weights, experts, swiglu_limit)
        return self._torch_experts(x, ids, weights, experts, swiglu_limit)

    @staticmethod
    def _fused_experts(x, ids, weights, experts: ExpertWeights, limit):
        """Dropless routing over ``E + 1`` groups (the last one gathers non-local rows and has zero
        weights and zero combine scale), so group sizes always sum to ``T * k`` and no row index is -1."""
        npu = torch_npu()
        t, k = ids.shape
        e = experts.num_local_experts
        local = local_index(ids, experts.expert_ids)
        expanded_x, expanded_row_idx, counts, _ = npu.npu_moe_init_routing_v2(
            x,
            local,
            expert_num=e + 1,
            drop_pad_mode=0,
            expert_tokens_num_type=1,
            expert_tokens_num_flag=True,
            quant_mode=-1,
            row_idx_type=0,
        )

        def gmm(inp: torch.Tensor, mats: list[torch.Tensor]) -> torch.Tensor:
            return npu.npu_grouped_matmul(
                [inp],
                mats,
                group_list=counts,
                split_item=3,
                group_type=0,
                group_list_type=1,
                output_dtype=x.dtype,
            )[0]

        gate = gmm(expanded_x, gmm_weights(experts.w1, x.dtype))
        up = gmm(expanded_x, gmm_weights(experts.w3, x.dtype))
        down = gmm(swiglu_act(gate, up, limit), gmm_weights(experts.w2, x.dtype))
        scales = torch.where(local < e, weights.float(), 0.0).to(x.dtype)
        return npu.npu_moe_finalize_routing(
            down, None, None, None, scales, expanded_row_idx, None, drop_pad_mode=2
        )

    @staticmethod
    def _torch_experts(x, ids, weights, experts: ExpertWeights, limit):
        """Plain torch: for each local expert, its rows in one batch; contributions added per token."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for i, gid in enumerate(experts.expert_ids):
            rows, cols = torch.nonzero(ids == gid, as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x.index_select(0, rows)
            w1, w3, w2 = (plain(w[i], x.dtype) for w in (experts.w1, experts.w3, experts.w2))
            xe = act_input(xe, experts.w1[i])
            h = swiglu_act(F.linear(xe, w1), F.linear(xe, w3), limit)
            row_w = weights[rows, cols].to(h.dtype)[:, None]
            if act_block(experts.w2[i]):  # the release scales the down projection's input, then quantises it
                y = F.linear(act_input(h * row_w, experts.w2[i]), w2)
                out.index_add_(0, rows, y.float())
                continue
            y = F.linear(h, w2)
            out.index_add_(0, rows, (y * row_w).float())
        return out.to(x.dtype)
