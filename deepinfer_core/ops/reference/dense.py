"""Reference dense ops in pure PyTorch, batch invariant by construction.

Batch invariance. CPU kernels are not row independent: a GEMM's blocking depends on ``M``, and vectorised
transcendental functions (``exp``, ``sigmoid``, ``sin`` ...) take a SIMD path for most elements but a scalar
path for the tail of a flattened buffer, so the same row can round differently alone and inside a batch.
Every op here therefore runs **one row at a time** on a fresh (aligned) ``[1, ...]`` copy of the row:
each call then sees the same shapes, strides, alignment and values whatever the other rows are, and a
deterministic kernel returns the same bits (for a fixed thread count). Weights are constant across calls.

Cost (measured single-threaded on the 2-core CI box): ``linear`` 64 -> 128 takes ~7 us per row against
~0.3 us per row for one batched ``F.linear`` (~20x); at 4096 -> 1024 it is ~640 us against ~45 us per row
(~14x: every row re-reads the weight). A 300-token prefill of the 4-layer test model takes ~1.1 s. This is
the reference platform: exact and batch invariant first, fast never.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from deepinfer_core.ops.act_quant import act_block, act_input, fp8_act_roundtrip
from deepinfer_core.ops.dense import DenseOps
from deepinfer_core.ops.mhc import HCParams, sinkhorn
from deepinfer_core.ops.quant_formats import dequant
from deepinfer_core.ops.weights import QuantizedWeight, Weight


def per_row(fn: Callable[..., torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
    """``cat([fn(x0[t:t+1].clone(), x1[t:t+1].clone(), ...) for t])``: run ``fn`` row by row."""
    if xs[0].shape[0] == 0:
        return fn(*xs)
    return torch.cat([fn(*(x[t : t + 1].clone() for x in xs)) for t in range(xs[0].shape[0])])


def dense_weight(weight: Weight, dtype: torch.dtype) -> torch.Tensor:
    """A plain ``[out, in]`` matrix in ``dtype``; quantized weights are dequantized block row by block row."""
    if isinstance(weight, QuantizedWeight):
        return dequant(weight, dtype)
    return weight if weight.dtype == dtype else weight.to(dtype)


def linear_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Row-by-row ``x [T, in] @ w.T`` for a plain matrix ``w`` already in ``x.dtype``."""
    out = x.new_empty(x.shape[0], w.shape[0])
    for t in range(x.shape[0]):
        out[t] = F.linear(x[t : t + 1].clone(), w)[0]
    return out


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm of a ``[1, ..., D]`` block in float32 (weighted variant multiplies before the cast)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = weight.float() * y
    return y.to(x.dtype)


def rope_rows(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool
) -> torch.Tensor:
    """Interleaved RoPE on the trailing ``2 * len(inv_freq)`` channels of ``x [R, H, D]`` at ``positions [R]``."""
    rd = 2 * inv_freq.shape[0]
    angle = positions.float()[:, None] * inv_freq.float()[None, :]
    cos = angle.cos()[:, None, :]
    sin = angle.sin()[:, None, :]
    if inverse:
        sin = -sin
    rope = x[..., x.shape[-1] - rd :].float()
    even, odd = rope[..., 0::2], rope[..., 1::2]
    rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    return torch.cat([x[..., : x.shape[-1] - rd], rotated.to(x.dtype)], dim=-1)


def swiglu_rows(
    x: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
    limit: float,
    act: tuple[int, int] = (0, 0),
    row_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Clamped SwiGLU of a single row ``x [1, D]`` with plain matrices in ``x.dtype``. ``act``: the activation
    blocks of the up and down projections' inputs (0: none; :mod:`deepinfer_core.ops.act_quant`);
    ``row_weight`` scales the down projection's input (a routed expert under activation quantisation)."""
    if act[0]:
        x = fp8_act_roundtrip(x, act[0])
    gate = F.linear(x, w1)
    up = F.linear(x, w3)
    if limit > 0:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    h = F.silu(gate) * up
    if row_weight is not None:
        h = h * row_weight.to(h.dtype)
    if act[1]:
        h = fp8_act_roundtrip(h, act[1])
    return F.linear(h, w2)


def swiglu_act(w1: Weight, w3: Weight, w2: Weight) -> tuple[int, int]:
    """The activation blocks of a SwiGLU's up (``w1`` and ``w3`` read the same input) and down projections."""
    if act_block(w1) != act_block(w3):
        raise ValueError(
            f"w1 and w3 read one input but quantise it differently: {act_block(w1)}, {act_block(w3)}"
        )
    return act_block(w1), act_block(w2)


class ReferenceDenseOps(DenseOps):
    activation_quant = True

    def linear(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        return linear_rows(act_input(x, weight), dense_weight(weight, x.dtype))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return per_row(lambda r: rms_norm_rows(r, weight, eps), x)

    def rope(
        self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False
    ) -> torch.Tensor:
        return per_row(lambda r, p: rope_rows(r, p, inv_freq, inverse), x, positions)

    def hc_pre(self, x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = x.shape[1]
        outs = [self._hc_pre_row(x[t : t + 1].clone(), hc) for t in range(x.shape[0])]
        if not outs:
            f32 = {"dtype": torch.float32, "device": x.device}
            return x.new_empty(0, x.shape[2]), torch.empty(0, n, **f32), torch.empty(0, n, n, **f32)
        collapsed, post, comb = (torch.cat(parts) for parts in zip(*outs))
        return collapsed, post, sinkhorn(comb, hc.sinkhorn_iters, hc.hc_eps)  # over every row at once

    @staticmethod
    def _hc_pre_row(x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, scale, hc_eps = x.shape[1], hc.scale, hc.hc_eps
        mixes = F.linear(rms_norm_rows(x.flatten(1).float(), None, hc.norm_eps), hc.fn.float())
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = hc.base.float().split([n, n, n * n])
        pre = torch.sigmoid(pre_w * scale[0] + pre_b) + hc_eps
        post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
        comb = torch.softmax(comb_w.view(1, n, n) * scale[2] + comb_b.view(n, n), dim=-1) + hc_eps
        collapsed = (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)
        return collapsed, post, comb

    def hc_post(
        self, y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        def row(y, residual, post, comb):
            dtype = y.dtype
            mixed = torch.matmul(comb.to(dtype).transpose(-1, -2), residual)
            return post.to(dtype).unsqueeze(-1) * y.unsqueeze(-2) + mixed

        return per_row(row, y, residual, post, comb)

    def hc_head(self, x: torch.Tensor, hc: HCParams) -> torch.Tensor:
        def row(x):
            mixes = F.linear(rms_norm_rows(x.flatten(1).float(), None, hc.norm_eps), hc.fn.float())
            pre = torch.sigmoid(mixes * hc.scale.float() + hc.base.float()) + hc.hc_eps
            return (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)

        return per_row(row, x)

    def swiglu_mlp(self, x: torch.Tensor, w1: Weight, w3: Weight, w2: Weight, limit: float) -> torch.Tensor:
        m1, m3, m2 = (dense_weight(w, x.dtype) for w in (w1, w3, w2))
        act = swiglu_act(w1, w3, w2)
        return per_row(lambda r: swiglu_rows(r, m1, m3, m2, limit, act), x)
