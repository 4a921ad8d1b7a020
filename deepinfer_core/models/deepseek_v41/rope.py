"""V4.1's RoPE frequencies (``docs/v41_reference.md``, 3.4).

Ratio-0 layers rotate with ``rope_theta`` and no YaRN. *Every* rotation of a compressed layer (its query, its
window KV, compressed KV, index query and keys, and the inverse on the output) uses ``compress_rope_theta``
with YaRN: with ``f_i = theta^(-2i/d)`` and ``cd(r) = d * ln(orig / (2 pi r)) / (2 ln theta)``,
``low = max(floor(cd(beta_fast)), 0)``, ``high = min(ceil(cd(beta_slow)), d - 1)``,
``ramp_i = clamp((i - low) / max(high - low, 1e-3), 0, 1)`` and ``f_i <- f_i / factor * ramp_i +
f_i * (1 - ramp_i)``, in float32 in that order. No attention scale factor.
"""

from __future__ import annotations

import math

import torch

from deepinfer_core.models.deepseek_v4.config import YarnParams


def inv_freq(dim: int, theta: float, yarn: YarnParams | None) -> torch.Tensor:
    """``[dim / 2]`` float32 frequencies of adjacent channel pairs."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if yarn is None:
        return freqs

    def corrected(rotations: float) -> float:
        return (
            dim
            * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low = max(math.floor(corrected(yarn.beta_fast)), 0)
    high = min(math.ceil(corrected(yarn.beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    keep = 1 - ramp
    return freqs / yarn.factor * (1 - keep) + freqs * keep
