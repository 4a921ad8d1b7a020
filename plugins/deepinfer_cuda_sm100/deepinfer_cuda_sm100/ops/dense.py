"""CUDA dense ops.

Triton: RMSNorm, RoPE, mHC (``hc_pre``/``hc_post``/``hc_head``), quantized ``linear`` (FP8 with 128 x 128
or V4.1's 32 x 32 scale blocks, FP4; dequantised in the GEMM) and ``swiglu_mlp`` (gate and up fused with the activation, then down).
TileLang: FP8 ``linear`` at prefill sizes on SM90 when tilelang is installed (``dispatch.fp8_gemm_backend``).
Torch on the GPU: ``linear`` with a plain BF16/FP32 weight is ``x @ w.T`` through cuBLAS, which a
Triton GEMM does not beat for dense shapes; one row (decode) goes to the Triton GEMV instead
(``dispatch.plain_gemv``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from deepinfer_core.plugin_api import (
    DenseOps,
    Fusion,
    HCParams,
    QuantizedWeight,
    Weight,
    act_block,
    compose_hc_post_pre,
    compose_hc_post_site_norm,
    compose_hc_pre_norm,
    compose_hc_site_norm,
    compose_linear_f32,
    compose_rms_norm_rope,
)
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import act_quant, engram, mhc, mhc_boundary, mx_gemm, norm_rope
from deepinfer_cuda_sm100.kernels import grouped_gemm as gg
from deepinfer_cuda_sm100.ops._tables import ScheduleCache, TableCache


class CudaDenseOps(DenseOps):
    fusions = frozenset(
        {
            Fusion.RMS_NORM_ROPE,
            Fusion.HC_PRE_NORM,
            Fusion.HC_POST_PRE,
            Fusion.HC_SITE_NORM,
            Fusion.HC_POST_SITE_NORM,
            Fusion.LINEAR_F32,
            Fusion.SWIGLU_MLP_ADD,
        }
    )
    activation_quant = True  # kernels/act_quant.py, and SM100's MX GEMM

    def __init__(self) -> None:
        self._tables = TableCache()
        self._mx_tables = TableCache()
        self._schedules = ScheduleCache()

    def linear(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        quantized = isinstance(weight, QuantizedWeight)
        if not quantized and not dispatch.plain_gemv(math.prod(x.shape[:-1]), x.dtype, weight):
            return x @ weight.T.to(x.dtype)
        return self._linear(x, weight, x.dtype)

    def linear_f32(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        """One row (the MoE router at decode) on the GEMV, which widens ``x`` as it loads it: the same floats as
        ``linear(x.float(), weight)`` without the cast's launch (v12 run 4: 2.5 us a MoE layer)."""
        rows = math.prod(x.shape[:-1])
        if isinstance(weight, QuantizedWeight) or not dispatch.plain_gemv(rows, torch.float32, weight):
            return compose_linear_f32(self, x, weight)
        return self._linear(x, weight, torch.float32)

    def _linear(self, x: torch.Tensor, weight: Weight, out_dtype: torch.dtype) -> torch.Tensor:
        """Quantized weights, or plain ones that :func:`dispatch.plain_gemv` sends to the GEMV."""
        lead, k = x.shape[:-1], x.shape[-1]
        mx = self._mx_linear(x.reshape(-1, k), weight, out_dtype)
        if mx is not None:
            return mx.view(*lead, -1)
        x2 = _act_input(x.reshape(-1, k), weight)
        T = x2.shape[0]
        quantized = isinstance(weight, QuantizedWeight)
        table = self._tables.get((weight,), lambda: gg.WeightTable.build([weight], x.device))
        out = torch.empty((T, table.n), dtype=out_dtype, device=x.device)
        if T == 0:
            return out.view(*lead, -1)
        fmt = weight.format if quantized else "plain"
        if quantized and out_dtype == x.dtype and dispatch.dequant_gemm(T, x.dtype):
            return torch.mm(x2, gg.dequantize(table, x.dtype, rows=T)[0].t(), out=out).view(*lead, -1)
        if fmt == "fp8_block" and weight.scale.dtype == torch.float32:
            tilelang = dispatch.fp8_gemm_backend(T, table.n, table.k, x.dtype) == "tilelang"
            if tilelang and not torch.cuda.is_current_stream_capturing():  # graphs replay Triton only
                from deepinfer_cuda_sm100.kernels import tl_fp8_gemm

                return tl_fp8_gemm.fp8_block_gemm(x2.contiguous(), weight.data, weight.scale, out).view(
                    *lead, -1
                )
        cfg = dispatch.gemm_config(T, table.n, table.k, fmt, gated=False, active=(T, 1))
        gg.grouped_gemm(x2, table, self._schedules.get(T, cfg.block_m, x.device), out, cfg)
        return out.view(*lead, -1)

    def _mx_linear(self, x2: torch.Tensor, weight: Weight, out_dtype: torch.dtype) -> torch.Tensor | None:
        """SM100, prefill rows, a weight marked for the release's FP8 activations: the activations' codes and
        scales, then the block-scaled MX GEMM (``kernels/mx_gemm.py``); ``None`` where that path does not apply."""
        cfg = dispatch.mx_gemm_config(x2.shape[0], act_block(weight))
        if cfg is None:
            return None
        table = self._mx_tables.get((weight,), lambda: mx_gemm.mx_table([weight], x2.device))
        if table is None:
            return None
        codes, scales = act_quant.fp8_act_codes(x2, act_block(weight))
        out = torch.empty((x2.shape[0], table.n), dtype=out_dtype, device=x2.device)
        sched = self._schedules.get(x2.shape[0], cfg.block_m, x2.device)
        return mx_gemm.mx_gemm(codes, scales, table, sched, out, cfg)

    def grouped_linear(self, x: torch.Tensor, weights: list[Weight]) -> torch.Tensor:
        """All groups in one grouped GEMM (the experts' kernel, groups as experts): row ``t * G + g`` of
        ``x [T*G, K]`` is read and written in place through the same row index, sorted by group, so no
        copy of ``x`` per group and one launch instead of ``G`` (plus their split-K epilogues). Plain weights
        (V4.1's dequantised ``wo_a`` groups) too, at decode sizes (:func:`dispatch.plain_grouped`)."""
        T, G, K = x.shape
        fmt = weights[0].format if isinstance(weights[0], QuantizedWeight) else "plain"
        same = all((w.format if isinstance(w, QuantizedWeight) else "plain") == fmt for w in weights)
        acts = {act_block(w) for w in weights}
        if fmt == "plain" and not (same and dispatch.plain_grouped(T, x.dtype, weights)):
            return super().grouped_linear(x, weights)  # (V4.1's wo_a groups, dequantised, at prefill: cuBLAS)
        if not same or T == 0 or fmt not in gg.FORMATS or len(acts) != 1:
            return super().grouped_linear(x, weights)
        table = self._tables.get(tuple(weights), lambda: gg.WeightTable.build(list(weights), x.device))
        a = _act_input(x.reshape(T * G, K), weights[0])
        a = a if a.stride(-1) == 1 else a.contiguous()
        out = torch.empty((T * G, table.n), dtype=x.dtype, device=x.device)
        cfg = dispatch.gemm_config(T, table.n, table.k, fmt, gated=False, active=(T * G, G))
        idx, *sched = self._schedules.grouped(T, G, cfg.block_m, x.device)
        gg.grouped_gemm(a, table, sched, out, cfg, a_idx=idx, c_idx=idx, all_rows_tiled=True)
        return out.view(T, G, table.n)

    def rms_norm(self, x, weight, eps):
        return norm_rope.rms_norm(x, weight, eps)

    def rope(self, x, positions, inv_freq, inverse=False):
        return norm_rope.rope(x, positions, inv_freq, inverse)

    def rms_norm_rope(self, x, weight, eps, positions, inv_freq):
        """One launch; rows wider than one register block keep the two ops."""
        if x.dim() != 3 or dispatch.rows_config(x.shape[-1]).block_d < x.shape[-1]:
            return compose_rms_norm_rope(self, x, weight, eps, positions, inv_freq)
        return norm_rope.rms_norm_rope(x, weight, eps, positions, inv_freq)

    def hc_pre(self, x, hc: HCParams):
        return mhc.hc_pre(x, hc.fn, hc.base, hc.scale, hc.sinkhorn_iters, hc.hc_eps, hc.norm_eps)

    def hc_post(self, y, residual, post, comb):
        return mhc.hc_post(y, residual, post, comb)

    def hc_pre_norm(self, x, hc: HCParams, weight):
        """Two launches up to ``dispatch.HC_FUSED_MAX_TOKENS`` tokens, else ``hc_pre`` and ``rms_norm``."""
        fused = mhc_boundary.hc_pre_norm(
            x, hc.fn, hc.base, hc.scale, hc.sinkhorn_iters, hc.hc_eps, hc.norm_eps, weight
        )
        return fused if fused is not None else compose_hc_pre_norm(self, x, hc, weight)

    def hc_post_pre(self, y, residual, post, comb, hc: HCParams, weight):
        """Two launches where :meth:`hc_pre_norm` has them, else ``hc_post``, ``hc_pre`` and ``rms_norm``."""
        mix = (hc.fn, hc.base, hc.scale, hc.sinkhorn_iters, hc.hc_eps, hc.norm_eps, weight)
        fused = mhc_boundary.hc_post_pre(y, residual, post, comb, *mix)
        return fused if fused is not None else compose_hc_post_pre(self, y, residual, post, comb, hc, weight)

    def hc_site_norm(self, x, hc: HCParams, pre, weight):
        """V4.1's site entry in two launches where :meth:`hc_pre_norm` has them, else ``hc_mixes``, ``hc_collapse``
        and ``rms_norm`` (four)."""
        mix = (hc.fn, hc.base, hc.scale, hc.sinkhorn_iters, hc.hc_eps, hc.norm_eps)
        fused = mhc_boundary.hc_pre_norm(x, *mix, weight, pre)
        return fused if fused is not None else compose_hc_site_norm(self, x, hc, pre, weight)

    def hc_post_site_norm(self, y, residual, post, comb, hc: HCParams, pre, weight):
        """A V4.1 sublayer's exit and the next site's entry in two launches where :meth:`hc_site_norm` has them."""
        mix = (hc.fn, hc.base, hc.scale, hc.sinkhorn_iters, hc.hc_eps, hc.norm_eps)
        fused = mhc_boundary.hc_post_pre(y, residual, post, comb, *mix, weight, pre)
        if fused is not None:
            return fused
        return compose_hc_post_site_norm(self, y, residual, post, comb, hc, pre, weight)

    def hc_mixes(self, x, hc: HCParams):
        """V4.1's single-pass mHC coefficients, all tokens in two launches (the core default runs one token at a
        time: ~80 torch launches a token and site)."""
        return mhc.hc_mixes(x, hc.fn, hc.base, hc.scale, hc.sinkhorn_iters, hc.hc_eps, hc.norm_eps)

    def hc_collapse(self, x, pre):
        return mhc.hc_collapse(x, pre)

    def engram_gate(self, h, key, value, weight, eps):
        """One launch (:mod:`deepinfer_cuda_sm100.kernels.engram`); the core's row arithmetic was ~10 torch launches."""
        return engram.engram_gate(h, key, value, weight, eps)

    def engram_hashes(self, ids, slots, pad_id, multipliers, primes, offsets):
        """One launch (``engram.engram_hashes``: the history read from the look-back pool, blocked, hashed); the
        core's torch was ~18 launches a step."""
        if ids.dim() == 2 and slots.dim() == 2 and primes.dim() == 3 and ids.dtype == torch.int64:
            return engram.engram_hashes(ids, slots, pad_id, multipliers, primes, offsets)
        return super().engram_hashes(ids, slots, pad_id, multipliers, primes, offsets)

    def hc_head(self, x, hc: HCParams):
        return mhc.hc_head(x, hc.fn, hc.base, hc.scale, hc.hc_eps, hc.norm_eps)

    def swiglu_mlp(self, x, w1, w3, w2, limit):
        return self._swiglu_mlp(x, w1, w3, w2, limit, None)

    def swiglu_mlp_add(self, x, w1, w3, w2, limit, add):
        """The down projection's epilogue adds ``add`` (the routed experts' output): no separate add launch."""
        return self._swiglu_mlp(x, w1, w3, w2, limit, add)

    def _swiglu_mlp(self, x, w1, w3, w2, limit, add):
        up = self._tables.get(
            (w1, w3, w2), lambda: [gg.WeightTable.build([w], x.device) for w in (w1, w3, w2)]
        )
        t1, t3, t2 = up
        T = x.shape[0]
        h = torch.empty((T, t1.n), dtype=x.dtype, device=x.device)
        out = torch.empty((T, t2.n), dtype=x.dtype, device=x.device)
        if add is not None:
            if add.shape != out.shape or add.dtype != out.dtype:
                raise ValueError(
                    f"add is {tuple(add.shape)} {add.dtype}; the MLP gives {tuple(out.shape)} {out.dtype}"
                )
            add = add.contiguous()
        if T == 0:
            return out
        if act_block(w1) != act_block(w3):
            raise ValueError("w1 and w3 read one input but quantise it differently")
        x = _act_input(x, w1)
        fmt = w1.format if isinstance(w1, QuantizedWeight) else "plain"
        if fmt != "plain" and isinstance(w2, QuantizedWeight) and dispatch.dequant_gemm(T, x.dtype):
            return _dequant_swiglu_mlp(x, t1, t3, t2, w2, limit, add, out)
        cfg_up = dispatch.gemm_config(T, t1.n, t1.k, fmt, gated=True, active=(T, 1))
        sched = self._schedules.get(T, cfg_up.block_m, x.device)
        gg.grouped_gemm(x, t3, sched, h, cfg_up, gate_table=t1, limit=limit)
        fmt2 = w2.format if isinstance(w2, QuantizedWeight) else "plain"
        cfg_dn = dispatch.gemm_config(T, t2.n, t2.k, fmt2, gated=False, active=(T, 1))
        cfg_dn = replace(cfg_dn, block_m=cfg_up.block_m)
        gg.grouped_gemm(_act_input(h, w2), t2, sched, out, cfg_dn, add=add)
        return out


def _dequant_swiglu_mlp(x, t1, t3, t2, w2, limit, add, out):
    """The MLP on dequantised weights and torch's GEMMs (:func:`dispatch.dequant_gemm`): gate and up in one GEMM
    (bf16 results, as the reference's linears give), the clamped SwiGLU, then the down projection, ``add`` added
    to its rounded result and the sum rounded (the kernel's epilogue). The SwiGLU is the reference's
    (``reference.dense.swiglu_rows``): on the rounded gate and up, in their dtype."""
    inter = t1.n
    w13 = torch.empty((2, inter, t1.k), dtype=x.dtype, device=x.device)
    gg.dequantize(t1, x.dtype, out=w13[:1], rows=x.shape[0])
    gg.dequantize(t3, x.dtype, out=w13[1:], rows=x.shape[0])
    gu = torch.mm(x, w13.view(2 * inter, t1.k).t())
    gate, up = gu[:, :inter], gu[:, inter:]
    if limit > 0:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    h = _act_input(torch.nn.functional.silu(gate) * up, w2)
    torch.mm(h, gg.dequantize(t2, x.dtype, rows=x.shape[0])[0].t(), out=out)
    return out if add is None else out.add_(add)


def _act_input(x: torch.Tensor, weight: Weight) -> torch.Tensor:
    """``x``, or its FP8 round trip where ``weight`` asks for the release's activation quantisation (one launch,
    :mod:`deepinfer_cuda_sm100.kernels.act_quant`)."""
    block = act_block(weight)
    return act_quant.fp8_act_roundtrip(x, block) if block else x
