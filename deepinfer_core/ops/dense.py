"""Dense ops: linear (plain or quantized), RMSNorm, interleaved partial RoPE, mHC mixing, SwiGLU MLP."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from deepinfer_core.ops.weights import Weight


class DenseOps(ABC):
    """Token-row ops used by every layer. All inputs are flattened over tokens: ``T`` rows."""

    @abstractmethod
    def linear(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        """``x [T, in] @ weight.T -> [T, out]`` in ``x.dtype``. ``weight`` may be a QuantizedWeight."""

    def linear_f32(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        """``x @ weight.T`` with a float32 result, ``x`` widened to float32 exactly first (V4's MoE router
        logits). New in plugin API 1.3; a platform may read ``x`` in its own dtype (this default casts it)."""
        return self.linear(x.float(), weight)

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

    def rms_norm_rope(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        eps: float,
        positions: torch.Tensor,
        inv_freq: torch.Tensor,
    ) -> torch.Tensor:
        """``rope(rms_norm(x, weight, eps), positions, inv_freq)`` over ``x [T, H, D]`` (V4's query heads,
        unweighted, and its KV row): the norm's result is rounded to ``x.dtype`` before the rotation, exactly
        as the two ops. New in plugin API 1.2; a platform may do both in one pass (this default calls them)."""
        return self.rope(self.rms_norm(x, weight, eps), positions, inv_freq)

    @abstractmethod
    def hc_pre(
        self,
        x: torch.Tensor,
        fn: torch.Tensor,
        base: torch.Tensor,
        scale: torch.Tensor,
        sinkhorn_iters: int,
        hc_eps: float,
        norm_eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """mHC entry. ``x [T, N, D]`` streams; ``fn [(2+N)*N, N*D]``, ``base [(2+N)*N]``, ``scale [3]`` (float32).

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

    def hc_pre_norm(
        self,
        x: torch.Tensor,
        fn: torch.Tensor,
        base: torch.Tensor,
        scale: torch.Tensor,
        sinkhorn_iters: int,
        hc_eps: float,
        norm_eps: float,
        weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`hc_pre` then :meth:`rms_norm` of its collapse (``weight``, ``norm_eps``): a sublayer's
        entry -> ``(normed [T, D] in x.dtype, post, comb)``. New in plugin API 1.3; a platform may do it in
        one pass (this default calls the two)."""
        collapsed, post, comb = self.hc_pre(x, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps)
        return self.rms_norm(collapsed, weight, norm_eps), post, comb

    def hc_post_pre(
        self,
        y: torch.Tensor,
        residual: torch.Tensor,
        post: torch.Tensor,
        comb: torch.Tensor,
        fn: torch.Tensor,
        base: torch.Tensor,
        scale: torch.Tensor,
        sinkhorn_iters: int,
        hc_eps: float,
        norm_eps: float,
        weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One sublayer's exit and the next one's entry: ``h = hc_post(y, residual, post, comb)`` then
        :meth:`hc_pre_norm` of ``h`` with the next sublayer's parameters -> ``(h [T, N, D], normed, post,
        comb)``. New in plugin API 1.3; a platform may do it in one pass (this default calls the two)."""
        h = self.hc_post(y, residual, post, comb)
        return (h, *self.hc_pre_norm(h, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, weight))

    @abstractmethod
    def hc_head(
        self,
        x: torch.Tensor,
        fn: torch.Tensor,
        base: torch.Tensor,
        scale: torch.Tensor,
        hc_eps: float,
        norm_eps: float,
    ) -> torch.Tensor:
        """Final stream collapse: ``pre = sigmoid(norm(x) @ fn.T * scale + base) + eps``; ``sum_n pre[n] x[n]`` -> ``[T, D]``."""

    @abstractmethod
    def swiglu_mlp(self, x: torch.Tensor, w1: Weight, w3: Weight, w2: Weight, limit: float) -> torch.Tensor:
        """``w2(silu(min(w1 x, limit)) * clamp(w3 x, -limit, limit))``; ``limit <= 0`` disables the clamp."""
