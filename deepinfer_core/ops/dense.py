"""Dense ops: linear (plain or quantized), RMSNorm, interleaved partial RoPE, mHC mixing, SwiGLU MLP, and
DeepSeek-V4.1's single-pass mHC and Engram gate."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from deepinfer_core.ops.fusion_kinds import Fusion
from deepinfer_core.ops.mhc import HCParams, collapse, mixes, sinkhorn
from deepinfer_core.ops.weights import Weight


class DenseOps(ABC):
    """Token-row ops used by every layer. All inputs are flattened over tokens: ``T`` rows."""

    #: the dense :class:`~deepinfer_core.ops.fusions.Fusion` s this backend also has, each a method of that name
    #: (``rms_norm_rope``, ``hc_pre_norm``, ``hc_post_pre``, ``linear_f32``); the others are composed by the core
    fusions: ClassVar[frozenset[Fusion]] = frozenset()
    #: ``linear``, ``grouped_linear`` and ``swiglu_mlp`` honour ``QuantizedWeight.act_block`` (the input of a
    #: marked weight's GEMM goes through :func:`deepinfer_core.ops.act_quant.act_input` first, or a kernel with
    #: the same values): DeepSeek-V4.1's release numerics, ``activation_quant="fp8"`` (plugin API 2.2)
    activation_quant: ClassVar[bool] = False

    @abstractmethod
    def linear(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        """``x [T, in] @ weight.T -> [T, out]`` in ``x.dtype``. ``weight`` may be a QuantizedWeight."""

    def grouped_linear(self, x: torch.Tensor, weights: list[Weight]) -> torch.Tensor:
        """``x [T, G, in]``, one weight per group ``[out, in]`` -> ``[T, G, out]``: ``out[:, g] =
        linear(x[:, g], weights[g])`` (V4's grouped output projection). A platform may do all groups in
        one launch; this default calls :meth:`linear` per group."""
        return torch.stack([self.linear(x[:, g].contiguous(), w) for g, w in enumerate(weights)], dim=1)

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        """RMSNorm over the last dim, computed in float32; ``weight`` (float32) multiplies before the
        cast back to ``x.dtype``. ``weight=None`` is the unweighted variant."""

    @abstractmethod
    def rope(
        self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False
    ) -> torch.Tensor:
        """Interleaved RoPE on the *trailing* ``2 * len(inv_freq)`` channels of ``x [T, H, D]``.

        Pairs are consecutive channels ``(2i, 2i+1)`` of the rope slice, angle ``positions[t] * inv_freq[i]``.
        ``inverse=True`` rotates by the negative angle (V4 un-rotates the attention output).
        Leading (nope) channels pass through. Math in float32, result in ``x.dtype``.
        """

    @abstractmethod
    def hc_pre(self, x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """mHC entry. ``x [T, N, D]`` streams; ``hc``: the site's ``fn [(2+N)*N, N*D]``, ``base [(2+N)*N]``,
        ``scale [3]`` (float32), ``sinkhorn_iters``, ``hc_eps`` and ``norm_eps``.

        Returns ``(collapsed [T, D] in x.dtype, post [T, N] f32, comb [T, N, N] f32)`` where
        ``pre = sigmoid(.)+eps``, ``post = 2*sigmoid(.)``, ``comb`` = Sinkhorn-Knopp projection of
        ``softmax(.)+eps`` (``sinkhorn_iters`` column/row normalisations, columns first), and
        ``collapsed = sum_n pre[n] * x[n]``.
        """

    @abstractmethod
    def hc_post(
        self, y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        """mHC exit: ``out[t, k] = post[t, k] * y[t] + sum_j comb[t, j, k] * residual[t, j]`` -> ``[T, N, D]``."""

    @abstractmethod
    def hc_head(self, x: torch.Tensor, hc: HCParams) -> torch.Tensor:
        """Final stream collapse (``hc.fn [N, N*D]``, ``base [N]``, ``scale [1]``; no Sinkhorn):
        ``pre = sigmoid(norm(x) @ fn.T * scale + base) + hc_eps``; ``sum_n pre[n] x[n]`` -> ``[T, D]``."""

    @abstractmethod
    def swiglu_mlp(self, x: torch.Tensor, w1: Weight, w3: Weight, w2: Weight, limit: float) -> torch.Tensor:
        """``w2(silu(min(w1 x, limit)) * clamp(w3 x, -limit, limit))``; ``limit <= 0`` disables the clamp."""

    # ------------------------------------------------------------------ DeepSeek-V4.1 (optional, with defaults)

    def hc_mixes(self, x: torch.Tensor, hc: HCParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """V4.1's single-pass mHC coefficients of the streams ``x [T, N, D]`` entering a site:
        ``mixes = (flat(x) @ hc.fn.T) * rsqrt(mean(flat(x)^2) + hc.norm_eps)`` over the ``N * D`` flattened
        channels, then ``pre``, ``post`` and ``comb`` as in :meth:`hc_pre` -> ``(pre [T, N], post [T, N],
        comb [T, N, N])``, float32 (:func:`~deepinfer_core.ops.mhc.mix_coefficients`). Unlike :meth:`hc_pre`
        nothing is collapsed: V4.1 collapses the *next* site's input with this ``pre``. Default: torch."""
        pre, post, comb = per_row_tuple(lambda r: mixes(r, hc), x)  # (the Sinkhorn needs no row-by-row run)
        return pre, post, sinkhorn(comb, hc.sinkhorn_iters, hc.hc_eps)

    def hc_collapse(self, x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """``sum_n pre[t, n] * x[t, n]`` over streams ``x [T, N, D]`` with ``pre [T, N]`` float32, computed in
        float32 and cast to ``x.dtype`` -> ``[T, D]``. Default: torch."""
        return per_row_tuple(lambda r, p: (collapse(r, p),), x, pre)[0]

    def engram_gate(
        self, h: torch.Tensor, key: torch.Tensor, value: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """V4.1's Engram injection into the streams ``h [T, N, D]``, per stream ``n`` and token ``t``:

        ``dot = sum_d(h * weight * key) * rsqrt(mean(h^2) + eps) * rsqrt(mean(key^2) + eps) / sqrt(D)``,
        ``gate = sigmoid(sign(dot) * sqrt(max(|dot|, 1e-6)))`` and ``h + gate * value``, with ``key [T, N, D]``,
        ``value [T, D]`` (shared by the streams) and ``weight [N, D]``, all in float32 -> ``[T, N, D]`` in
        ``h.dtype``. Default: torch."""
        return per_row_tuple(lambda a, b, c: (engram_gate_rows(a, b, c, weight, eps),), h, key, value)[0]

    def engram_hashes(
        self,
        ids: torch.Tensor,
        slots: torch.Tensor,
        pad_id: int,
        multipliers: torch.Tensor,
        primes: torch.Tensor,
        offsets: torch.Tensor,
    ) -> torch.Tensor:
        """V4.1's Engram table rows for each token's n-grams (``deepseek_v41.engram``): the compressed ids at
        ``p, p-1, ...`` are ``ids[slots[t]]`` (``ids [S, 1]`` int64, the look-back pool; ``slots [T, n]``,
        ``-1`` before the sequence start; a dead id, ``-1``, blocks it and every older one); blocked ones read
        ``pad_id``; per Engram layer ``l`` (``multipliers [L, n]`` int64), ``rolling = t_0 * m_0``, and for
        ``k = 1..n-1``: ``rolling ^= t_k * m_k``, row ``rolling % primes[l, k-1, head] + offsets[l, (k-1) *
        heads + head]`` -> ``[T, L, (n - 1) * heads]`` int64 (plugin API 2.13). Default: torch."""
        return engram_hash_rows(
            torch.where(slots >= 0, ids[slots.clamp(min=0), 0], -1), pad_id, multipliers, primes, offsets
        )


def engram_hash_rows(
    history: torch.Tensor, pad_id: int, multipliers: torch.Tensor, primes: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """:meth:`DenseOps.engram_hashes` of the ids read already: ``history [T, n]`` (``-1`` dead)."""
    blocked = (history < 0).cummax(dim=1).values  # an older slot of a blocked one is blocked too
    tokens = torch.where(blocked, pad_id, history)
    products = tokens[:, None, :] * multipliers[None]  # [T, layers, n]
    rolling, cols = products[..., 0], []
    for i in range(1, products.shape[-1]):
        rolling = torch.bitwise_xor(rolling, products[..., i])
        cols.append(rolling[..., None] % primes[None, :, i - 1])
    return torch.cat(cols, dim=-1) + offsets[None]


def per_row_tuple(fn, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``fn`` (returning a tuple) on each row ``x[t:t+1]`` alone, its outputs concatenated: the defaults
    above give every row the same arithmetic whatever else is in the batch."""
    if xs[0].shape[0] == 0:
        return fn(*xs)
    outs = [fn(*(x[t : t + 1].clone() for x in xs)) for t in range(xs[0].shape[0])]
    return tuple(torch.cat(parts) for parts in zip(*outs))


#: the smallest ``|dot|`` whose square root V4.1's Engram gate takes
ENGRAM_GATE_FLOOR = 1e-6


def engram_gate_rows(
    h: torch.Tensor, key: torch.Tensor, value: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """:meth:`DenseOps.engram_gate` on a block of rows."""
    hf, kf = h.float(), key.float()
    rstd = torch.rsqrt(hf.square().mean(-1) + eps) * torch.rsqrt(kf.square().mean(-1) + eps)
    dot = (hf * weight.float() * kf).sum(-1) * rstd * h.shape[-1] ** -0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(ENGRAM_GATE_FLOOR).sqrt(), dot))
    return (hf + gate.unsqueeze(-1) * value.float().unsqueeze(-2)).to(h.dtype)
