"""CUDA MoE ops: fused routing, grouped expert GEMMs and the combine (Triton), sorting in torch above decode sizes.

``experts`` runs, with no host synchronisation:

1. global ids -> local expert index (``-1`` for experts another EP rank owns) via a lookup table;
2. the tile schedule: stable sort of the ``T*k`` (token, slot) pairs by local expert and the tile list
   (one launch, ``kernels/schedule.py``, up to 4,096 pairs; ``grouped_gemm.tile_schedule`` above);
3. gate+up grouped GEMM over the gathered token rows, with the clamped SwiGLU in its epilogue -> ``h``;
4. down grouped GEMM over ``h``, each row scaled by its routing weight and scattered back to its
   (token, slot) position;
5. the ``k`` slots of each token summed in float32 and cast, one launch (``kernels/combine.py``).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from deepinfer_core.plugin_api import ExpertWeights, MoEOps, QuantizedWeight, act_block
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import act_quant, combine, mx_gemm, routing, schedule
from deepinfer_cuda_sm100.kernels import grouped_gemm as gg
from deepinfer_cuda_sm100.ops._tables import TableCache


class _Prepared:
    def __init__(self, experts: ExpertWeights, device: torch.device) -> None:
        self.w1 = gg.WeightTable.build(experts.w1, device)
        self.w3 = gg.WeightTable.build(experts.w3, device)
        self.w2 = gg.WeightTable.build(experts.w2, device)
        lut = torch.full((max(experts.expert_ids) + 1,), -1, dtype=torch.int64)
        lut[torch.tensor(experts.expert_ids)] = torch.arange(len(experts.expert_ids))
        self.lut = lut.to(device)
        first = experts.w1[0]
        self.fmt = first.format if isinstance(first, QuantizedWeight) else "plain"
        first2 = experts.w2[0]
        self.fmt2 = first2.format if isinstance(first2, QuantizedWeight) else "plain"
        #: activation blocks of the up and down projections' inputs (0: none; V4.1's release numerics)
        self.act_up, self.act_down = act_block(first), act_block(first2)
        if {act_block(w) for w in experts.w1 + experts.w3} != {self.act_up} or {
            act_block(w) for w in experts.w2
        } != {self.act_down}:
            raise ValueError("the experts' weights quantise their inputs differently")
        # the weight lists, not the ExpertWeights: the cache holding this is keyed by a weak reference to that
        # object, which a strong one from here would keep alive forever
        self._mx_weights, self._device, self._mx = (
            (list(experts.w3), list(experts.w1), list(experts.w2)),
            device,
            False,
        )
        #: every expert id routing can give is held here (no expert parallelism): each (token, slot) row of
        #: the down projection's output is written, so it needs no zero fill (known from the host table)
        self.all_local = bool((lut >= 0).all())

    @property
    def mx(self):
        """SM100's MX GEMM tables (up, gate, down), or ``None`` where the experts are not MX-shaped; built on first
        use (only where the MX GEMM runs: the ue8m0 byte copies of the scales cost memory), on the host."""
        if self._mx is False:
            tabs = [mx_gemm.mx_table(ws, self._device) for ws in self._mx_weights]
            self._mx = None if any(t is None for t in tabs) else tuple(tabs)
        return self._mx


class CudaMoEOps(MoEOps):
    activation_quant = True  # kernels/act_quant.py, and SM100's MX GEMM

    def __init__(self) -> None:
        self._prepared = TableCache()

    def route_topk(self, logits, correction_bias, top_k, score_func, routed_scaling_factor):
        return routing.route_topk(logits, correction_bias, top_k, score_func, routed_scaling_factor)

    def route_hash(self, logits, ids, score_func, routed_scaling_factor):
        return routing.route_hash(logits, ids, score_func, routed_scaling_factor)

    def experts(self, x, ids, weights, experts, swiglu_limit):
        T, D = x.shape
        k = ids.shape[1]
        if T == 0 or experts.num_local_experts == 0:
            return torch.zeros((T, D), dtype=x.dtype, device=x.device)
        p = self._prepared.get((experts,), lambda: _Prepared(experts, x.device))
        E = experts.num_local_experts
        mx = self._mx_experts(x, ids, weights, p, E, swiglu_limit)
        if mx is not None:
            return mx
        active = (T * k, min(E, T * k))  # rows, and experts holding them at most
        # rows per expert that has any, expected under uniform routing (decode: mostly 1-2)
        per = T * k / max(1.0, E * (1 - (1 - min(k, E) / E) ** T))
        cfg_up = dispatch.gemm_config(per, p.w1.n, p.w1.k, p.fmt, gated=True, active=active)
        cfg_dn = dispatch.gemm_config(per, p.w2.n, p.w2.k, p.fmt2, gated=False, active=active)
        cfg_dn = replace(cfg_dn, block_m=cfg_up.block_m)
        fused = schedule.moe_schedule(ids, p.lut, weights, E, cfg_up.block_m)
        if fused is not None:  # decode sizes: one launch
            order, a_idx, row_w, *sched = fused
        else:
            flat = ids.reshape(-1)
            known = (flat >= 0) & (flat < p.lut.numel())
            local = torch.where(known, p.lut[flat.clamp(0, p.lut.numel() - 1)], -1)
            order, *sched = gg.tile_schedule(local, E, cfg_up.block_m)
            a_idx, row_w = order // k, weights.reshape(-1).float()[order]
        h = torch.empty((T * k, p.w1.n), dtype=x.dtype, device=x.device)
        if p.act_up:
            x = act_quant.fp8_act_roundtrip(x, p.act_up)
        gg.grouped_gemm(
            x.contiguous(),
            p.w3,
            sched,
            h,
            cfg_up,
            a_idx=a_idx,
            gate_table=p.w1,
            limit=swiglu_limit,
            all_rows_tiled=p.all_local,
        )
        y = (torch.empty if p.all_local else torch.zeros)((T * k, D), dtype=torch.float32, device=x.device)
        if p.act_down:  # the release's order: each row scaled by its routing weight, then quantised
            h, row_w = act_quant.fp8_act_roundtrip(h, p.act_down, row_w=row_w), None
        gg.grouped_gemm(h, p.w2, sched, y, cfg_dn, c_idx=order, row_w=row_w, all_rows_tiled=p.all_local)
        return combine.combine(y, k, x.dtype)

    @staticmethod
    def _mx_experts(x, ids, weights, p: _Prepared, E: int, limit: float) -> torch.Tensor | None:
        """SM100, prefill rows, experts marked for the release's FP8 activations: the gate / up and down projections
        on the block-scaled MX MMA (``kernels/mx_gemm.py``), the routing weight applied to the down projection's
        input before it is quantised; ``None`` where that path does not apply."""
        T, k = ids.shape
        cfg = dispatch.mx_gemm_config(T * k, p.act_up)
        if cfg is None or not p.act_up or p.act_down != p.act_up or p.mx is None:
            return None
        flat = ids.reshape(-1)
        known = (flat >= 0) & (flat < p.lut.numel())
        local = torch.where(known, p.lut[flat.clamp(0, p.lut.numel() - 1)], -1)
        order, *sched = gg.tile_schedule(local, E, cfg.block_m)
        up, gate, down = p.mx
        codes, scales = act_quant.fp8_act_codes(x, p.act_up)
        h = torch.empty((T * k, up.n), dtype=x.dtype, device=x.device)
        mx_gemm.mx_gemm(codes, scales, up, sched, h, cfg, a_idx=order // k, gate=gate, limit=limit)
        row_w = weights.reshape(-1).float()[order]
        h_codes, h_scales = act_quant.fp8_act_codes(h, p.act_down, row_w=row_w)
        y = (torch.empty if p.all_local else torch.zeros)(
            (T * k, down.n), dtype=torch.float32, device=x.device
        )
        mx_gemm.mx_gemm(h_codes, h_scales, down, sched, y, cfg, c_idx=order)
        return combine.combine(y, k, x.dtype)
