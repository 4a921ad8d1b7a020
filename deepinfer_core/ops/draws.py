"""Keyed draws: the randomness of sampling as a pure function of (seed, position, stream).

A sequence's draws used to come from a ``torch.Generator`` of its own: one launch and one Python step per row
of a batch, and a state that only the host could advance. Here the uniform a row needs is computed from
integers the step already has on the device:

- ``seed``: the sample's 63-bit sampling seed (``Sequence.sampling_seed``);
- ``position``: where the drawn token goes in the sequence (its index, prompt included), or a per-sequence
  draw counter for draws that are not positional (a proposer's drafts, with a seed of their own);
- ``stream``: which use (:data:`SAMPLE`: the token drawn at a position; :data:`ACCEPT`: the acceptance test of
  the draft at a position), so that no two uses share a uniform.

So a seeded request draws the same tokens whatever its batch, chunking, preemption or speculation, a whole
batch draws in one launch, and a captured graph can draw (no generator state to advance on the host).

The key is bit-exact integer arithmetic modulo ``2**32`` (``mix`` is Wellons' "lowbias32" finaliser)::

    key(seed, pos, stream) = mix(mix(mix(mix(lo(seed) ^ K0) ^ hi(seed)) ^ lo(pos)) ^ (hi(pos) + stream * K1))
    uniform                = (key + 0.5) * 2**-32            # float64, exact, in (0, 1)

``lo``/``hi`` are the low and high 32 bits of a non-negative int64. A token is drawn from weights ``w [V]``
(non-negative, any scale) by inverting their running sum in float64: with ``c_i = w_0 + ... + w_i`` summed in
token order and ``x = uniform * c_{V-1}``, the token is the number of ``c_i <= x`` (so ``c_{t-1} <= x < c_t``:
token ``t`` with probability ``w_t / sum(w)`` up to float64 rounding, and never a token of weight 0); should
rounding put ``x`` at or past the total, the last token of positive weight. A row of zeros draws token 0. A
platform that draws in a kernel computes the same key; its running sum may round differently from torch's
(float64: a draw could differ only where ``x`` falls within that rounding of a boundary).
"""

from __future__ import annotations

import torch

#: streams: the token drawn at a position; the acceptance uniform of the draft at a position
SAMPLE, ACCEPT = 0, 1
K0, K1 = 0x9E3779B9, 0x632BE5AB
M1, M2 = 0x7FEB352D, 0x846CA68B
MASK32 = 0xFFFF_FFFF


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x * m mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without int64 overflow (16-bit halves of ``m``)."""
    lo = x * (m & 0xFFFF)
    hi = ((x * (m >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, M1)
    x = x ^ (x >> 15)
    x = _mul32(x, M2)
    return x ^ (x >> 16)


def keys(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """``[...]`` int64 32-bit keys of ``seeds`` and ``positions`` (non-negative int64, the same shape)."""
    s, p = seeds.to(torch.int64), positions.to(torch.int64)
    k = mix((s & MASK32) ^ K0)
    k = mix(k ^ ((s >> 32) & MASK32))
    k = mix(k ^ (p & MASK32))
    return mix(k ^ ((((p >> 32) & MASK32) + stream * K1) & MASK32))


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """float64 in ``(0, 1)``, one per key: ``(key + 0.5) * 2**-32``."""
    return (keys(seeds, positions, stream).to(torch.float64) + 0.5) * 2.0**-32


def draw(
    weights: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, stream: int = SAMPLE
) -> torch.Tensor:
    """One token per row of ``weights [B, V]`` (non-negative, any scale), row ``b`` keyed at ``(seeds[b],
    positions[b], stream)``: the inverse of the row's float64 running sum. -> ``[B]`` int64."""
    w = weights.to(torch.float64)
    c = torch.cumsum(w, dim=-1)
    x = uniforms(seeds, positions, stream) * c[:, -1]
    t = (c <= x[:, None]).sum(dim=-1)
    ids = torch.arange(w.shape[-1], device=w.device)
    last = torch.where(w > 0, ids, 0).amax(dim=-1)  # rounding put x at the total: the last positive weight
    return torch.minimum(t, last)
