"""The ops this backend implements itself. Everything else falls back to the reference ops."""

from __future__ import annotations

import torch

from deepinfer_core.plugin_api import DenseOps, Fusion, HCParams, SamplingOps, reference_op


class ExampleDenseOps(DenseOps):
    """Own RMSNorm (one fused expression) and one declared fusion, RMSNorm + RoPE; the other dense ops are
    delegated to the reference, and the fusions it does not declare are composed by the core."""

    fusions = frozenset({Fusion.RMS_NORM_ROPE})

    def __init__(self) -> None:
        self._ref = reference_op("dense")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        xf = x.float()
        y = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * weight if weight is not None else y).to(x.dtype)

    def rms_norm_rope(self, x, weight, eps, positions, inv_freq):
        """The declared fusion: ``rope(rms_norm(x))`` in one call (a device backend would do it in one kernel);
        the conformance kit checks it against the reference's ``rms_norm`` then ``rope``."""
        return self._ref.rope(self.rms_norm(x, weight, eps), positions, inv_freq)

    def linear(self, x, weight):
        return self._ref.linear(x, weight)

    def rope(self, x, positions, inv_freq, inverse=False):
        return self._ref.rope(x, positions, inv_freq, inverse)

    def hc_pre(self, x, hc: HCParams):
        return self._ref.hc_pre(x, hc)

    def hc_post(self, y, residual, post, comb):
        return self._ref.hc_post(y, residual, post, comb)

    def hc_head(self, x, hc: HCParams):
        return self._ref.hc_head(x, hc)

    def swiglu_mlp(self, x, w1, w3, w2, limit):
        return self._ref.swiglu_mlp(x, w1, w3, w2, limit)


class ExampleSamplingOps(SamplingOps):
    """Own argmax (lowest id wins ties, as the contract says); the rest is the reference."""

    def __init__(self) -> None:
        self._ref = reference_op("sampling")

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        best = logits.max(dim=-1, keepdim=True).values
        ids = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
        return torch.where(logits == best, ids, logits.shape[-1]).min(dim=-1).values

    def apply_penalties(self, *args, **kwargs):
        return self._ref.apply_penalties(*args, **kwargs)

    def probs(self, logits, params):
        return self._ref.probs(logits, params)

    def apply_bitmask(self, logits, bitmask):
        return self._ref.apply_bitmask(logits, bitmask)

    # sample_keyed and rejection_sample_keyed: the base class's keyed draws (the core's torch code)
