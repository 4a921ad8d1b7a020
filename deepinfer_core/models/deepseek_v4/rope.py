"""RoPE frequencies: plain RoPE for sliding-window layers, YaRN for compressed (CSA / HCA) layers.

V4 rotates only the trailing ``qk_rope_head_dim`` channels of a head, interleaved (pairs ``2i, 2i+1``), so
one frequency per pair: ``qk_rope_head_dim // 2`` entries. The YaRN blend below is the one of
transformers' ``_compute_yarn_parameters`` (with ``truncate``: floor / ceil of the correction range, as
DeepSeek's reference does too) and ``attention_factor = 1.0``: cos / sin are never rescaled.
"""

from __future__ import annotations

import math

import torch

from deepinfer_core.models.deepseek_v4.config import DeepseekV4Config, YarnParams


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    """``1 / theta^(2i / dim)`` for ``i < dim / 2``, float32."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _correction_dim(num_rotations: float, dim: int, theta: float, max_pos: int) -> float:
    """The channel index whose wavelength completes ``num_rotations`` turns over ``max_pos`` tokens."""
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))


def yarn_inv_freq(dim: int, theta: float, yarn: YarnParams) -> torch.Tensor:
    """YaRN: interpolate (divide by ``factor``) the low frequencies, keep the high ones, ramp between."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (yarn.factor * pos_freqs)
    orig = yarn.original_max_position_embeddings
    low = max(math.floor(_correction_dim(yarn.beta_fast, dim, theta, orig)), 0)
    high = min(math.ceil(_correction_dim(yarn.beta_slow, dim, theta, orig)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def layer_inv_freq(cfg: DeepseekV4Config, compressed: bool) -> torch.Tensor:
    """The frequencies a layer uses: plain at ``rope_theta`` (sliding) or YaRN at ``compress_rope_theta``."""
    if not compressed:
        return default_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta)
    if cfg.compress_yarn is None:
        return default_inv_freq(cfg.qk_rope_head_dim, cfg.compress_rope_theta)
    return yarn_inv_freq(cfg.qk_rope_head_dim, cfg.compress_rope_theta, cfg.compress_yarn)
