"""Dense ops on the NPU: ``npu_rms_norm``, ``npu_rotary_mul`` (interleave), ``npu_mhc_pre`` +
``npu_mhc_sinkhorn``, ``npu_mhc_post``; linear, SwiGLU and ``hc_head`` in plain torch."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from deepinfer_ascend950._npu import torch_npu
from deepinfer_ascend950.ops.weights import plain
from deepinfer_core.plugin_api import DenseOps, HCParams, Weight, act_input

log = logging.getLogger(__name__)

HALF = (torch.bfloat16, torch.float16)
MHC_STREAMS = (4, 6, 8)  # n supported by npu_mhc_pre / npu_mhc_sinkhorn


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """One column normalisation, then ``iters - 1`` (row, column) rounds, on ``[..., N, N]``."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def _mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """``rms_norm(x.flatten(1)) @ fn.T`` in float32 for ``x [T, N, D]``."""
    xf = x.flatten(1).float()
    return F.linear(xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + norm_eps), fn.float())


class AscendDenseOps(DenseOps):
    activation_quant = True  # the core's round trip in torch (ops/act_quant.py)

    def __init__(self, fused: dict[str, bool]):
        self.fused = fused
        self._mhc_pre_ok = True  # cleared if npu_mhc_pre ever returns an undocumented shape

    def linear(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        return F.linear(act_input(x, weight), plain(weight, x.dtype))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        """``npu_rms_norm(self, gamma, epsilon) -> (y, rstd)`` on float32 input and gamma: the contract's
        float32 math, with the weight applied before the cast back."""
        if not self.fused["rms_norm"] or x.shape[-1] == 0:
            xf = x.float()
            y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
            return (y if weight is None else weight.float() * y).to(x.dtype)
        gamma = torch.ones(x.shape[-1], device=x.device) if weight is None else weight.float()
        return torch_npu().npu_rms_norm(x.float(), gamma, epsilon=eps)[0].to(x.dtype)

    def rope(
        self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False
    ) -> torch.Tensor:
        """``npu_rotary_mul(input, r1=cos, r2=sin, rotary_mode="interleave")`` on the trailing rope slice,
        layout TND (``[T, H, rd]``) with ``cos``/``sin`` ``[T, 1, rd]`` holding each angle twice
        (pairs ``(2i, 2i+1)``), in float32; ``inverse`` negates ``sin``."""
        rd = 2 * inv_freq.shape[0]
        angle = positions.float()[:, None] * inv_freq.float().to(x.device)[None, :]
        cos, sin = angle.cos(), angle.sin()
        if inverse:
            sin = -sin
        head, tail = x[..., : x.shape[-1] - rd], x[..., x.shape[-1] - rd :].float()
        if self.fused["rope"] and x.dim() == 3 and x.shape[1] < 1000 and 0 < rd < 896:
            c2 = cos.repeat_interleave(2, dim=-1)[:, None, :]
            s2 = sin.repeat_interleave(2, dim=-1)[:, None, :]
            rot = torch_npu().npu_rotary_mul(tail.contiguous(), c2, s2, rotary_mode="interleave")
        else:
            even, odd = tail[..., 0::2], tail[..., 1::2]
            c, s = cos[:, None, :], sin[:, None, :]
            rot = torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2)
        return torch.cat([head, rot.to(x.dtype)], dim=-1)

    def hc_pre(self, x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, n, _ = x.shape
        fn, base, scale, sinkhorn_iters = hc.fn, hc.base, hc.scale, hc.sinkhorn_iters
        hc_eps, norm_eps = hc.hc_eps, hc.norm_eps
        if self._mhc_fused(x, fn) and 1 <= sinkhorn_iters <= 100:
            npu = torch_npu()
            h_in, h_post, h_res = npu.npu_mhc_pre(
                x, fn.float(), scale.float(), base.float(), norm_eps=norm_eps, hc_eps=hc_eps
            )[:3]
            if tuple(h_post.shape) == (t, n) and tuple(h_res.shape) == (t, n, n):
                comb = npu.npu_mhc_sinkhorn(h_res, eps=hc_eps, num_iters=sinkhorn_iters)[0]
                return h_in, h_post, comb
            log.warning(
                "npu_mhc_pre returned h_post %s / h_res %s, not [T, n] / [T, n, n]; using plain torch for hc_pre",
                tuple(h_post.shape),
                tuple(h_res.shape),
            )
            self._mhc_pre_ok = False
        mixes = _mixes(x, fn, norm_eps)
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = base.float().split([n, n, n * n])
        pre = torch.sigmoid(pre_w * scale[0] + pre_b) + hc_eps
        post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
        comb = torch.softmax(comb_w.view(t, n, n) * scale[2] + comb_b.view(n, n), dim=-1) + hc_eps
        collapsed = (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)
        return collapsed, post, sinkhorn(comb, sinkhorn_iters, hc_eps)

    def _mhc_fused(self, x: torch.Tensor, fn: torch.Tensor) -> bool:
        """The documented envelope of npu_mhc_pre: bf16/fp16 ``x [T, n, D]``, n in {4, 6, 8},
        D a multiple of 16 up to 16384, ``phi [n*n + 2n, n*D]``."""
        _, n, d = x.shape
        return (
            self.fused["hc_pre"]
            and self._mhc_pre_ok
            and x.dtype in HALF
            and n in MHC_STREAMS
            and d % 16 == 0
            and 0 < d <= 16384
            and tuple(fn.shape) == (n * n + 2 * n, n * d)
        )

    def hc_post(
        self, y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        """``npu_mhc_post(x, h_res, h_out, h_post) = h_res @ x + h_out * h_post``: our
        ``out[k] = sum_j comb[j, k] res[j]`` is ``h_res = comb^T``."""
        if self.fused["hc_post"] and residual.dtype in HALF and y.dtype == residual.dtype:
            return torch_npu().npu_mhc_post(residual, comb.float().transpose(-1, -2), y, post.float())
        mixed = torch.matmul(comb.to(y.dtype).transpose(-1, -2), residual)
        return post.to(y.dtype).unsqueeze(-1) * y.unsqueeze(-2) + mixed

    def hc_head(self, x: torch.Tensor, hc: HCParams) -> torch.Tensor:
        pre = torch.sigmoid(_mixes(x, hc.fn, hc.norm_eps) * hc.scale.float() + hc.base.float()) + hc.hc_eps
        return (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)

    def swiglu_mlp(self, x: torch.Tensor, w1: Weight, w3: Weight, w2: Weight, limit: float) -> torch.Tensor:
        xq = act_input(x, w1)  # w1 and w3 read one input (V4.1: its FP8 round trip, ops/act_quant.py)
        h = swiglu_act(F.linear(xq, plain(w1, x.dtype)), F.linear(xq, plain(w3, x.dtype)), limit)
        return F.linear(act_input(h, w2), plain(w2, x.dtype))


def swiglu_act(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """``silu(min(gate, limit)) * clamp(up, -limit, limit)``; ``limit <= 0`` disables the clamp."""
    if limit > 0:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor, w2: torch.Tensor, limit: float) -> torch.Tensor:
    return F.linear(swiglu_act(gate, up, limit), w2)
