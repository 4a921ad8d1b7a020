"""V4 MoE: routed experts (learned top-k with a selection-only bias, or hash routing by ``tid2eid``) plus one
shared expert, every SwiGLU clamped at ``swiglu_limit``."""

from __future__ import annotations

import torch

from deepinfer_core.models.deepseek_v4.config import HASH_MOE, DeepseekV4Config
from deepinfer_core.models.deepseek_v4.params import Module, Slot
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.moe import EPRouting
from deepinfer_core.ops.weights import ExpertWeights


class Expert(Module):
    """SwiGLU ``w2(silu(w1 x) * (w3 x))`` with ``w1, w3 [inter, hidden]`` and ``w2 [hidden, inter]``."""

    def __init__(self, hidden: int, inter: int):
        self.w1 = Slot("w1.weight", (inter, hidden), "linear")
        self.w2 = Slot("w2.weight", (hidden, inter), "linear")
        self.w3 = Slot("w3.weight", (inter, hidden), "linear")


class MoE(Module):
    def __init__(self, cfg: DeepseekV4Config, mlp_type: str):
        self.cfg, self.is_hash = cfg, mlp_type == HASH_MOE
        e, d = cfg.n_routed_experts, cfg.hidden_size
        self.gate = Slot("gate.weight", (e, d), "float32")
        if self.is_hash:
            self.tid2eid = Slot(
                "gate.tid2eid", (cfg.vocab_size, cfg.num_experts_per_tok), "index", bounds=(0, e)
            )
        else:
            self.bias = Slot("gate.bias", (e,), "float32")
        self.experts = [Expert(d, cfg.moe_intermediate_size) for _ in range(e)]
        self.shared_experts = Expert(d, cfg.moe_intermediate_size * cfg.n_shared_experts)
        self.routed: ExpertWeights | None = None
        #: set by :mod:`deepinfer_core.distributed.ep` under expert parallelism (``routed`` then holds
        #: this rank's slots only)
        self.ep: EPRouting | None = None

    def post_load(self) -> None:
        ex = self.experts
        self.routed = ExpertWeights(
            w1=[x.w1.value for x in ex],
            w3=[x.w3.value for x in ex],
            w2=[x.w2.value for x in ex],
            expert_ids=list(range(len(ex))),
        )

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor, ops: Backends) -> torch.Tensor:
        """``x [T, hidden]`` (normed) -> ``[T, hidden]``; ``input_ids [T]`` pick the experts of hash layers."""
        cfg = self.cfg
        logits = ops.fused.linear_f32(x, self.gate.value)
        if self.is_hash:
            ids = self.tid2eid.value[input_ids]
            weights = ops.moe.route_hash(logits, ids, cfg.scoring_func, cfg.routed_scaling_factor)
        else:
            weights, ids = ops.moe.route_topk(
                logits, self.bias.value, cfg.num_experts_per_tok, cfg.scoring_func, cfg.routed_scaling_factor
            )
        if self.ep is None:
            routed = ops.moe.experts(x, ids, weights, self.routed, cfg.swiglu_limit)
        else:
            routed = self._expert_parallel(x, ids, weights, ops)
        s = self.shared_experts
        return ops.fused.swiglu_mlp_add(x, s.w1.value, s.w3.value, s.w2.value, cfg.swiglu_limit, routed)

    def _expert_parallel(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, ops: Backends
    ) -> torch.Tensor:
        """Dispatch (token, expert) pairs to the ranks holding the experts, run them there unweighted,
        combine back with the routing weights. Runs on idle ranks too (``T = 0``): the all-to-alls meet."""
        ep = self.ep
        ep.load += torch.bincount(ids.reshape(-1).long().cpu(), minlength=ep.load.numel())
        d = ops.moe.dispatch(x, ids, ep, ops.comm)
        ones = torch.ones((d.x.shape[0], 1), dtype=torch.float32, device=d.x.device)
        y = ops.moe.experts(d.x, d.ids[:, None], ones, self.routed, self.cfg.swiglu_limit)
        return ops.moe.combine(y, ids, weights, d, ep, ops.comm)
