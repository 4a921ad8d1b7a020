"""The token bitmask layout shared by the grammar backends and ``SamplingOps.apply_bitmask``.

``bitmask [R, W]`` int32 on the CPU with ``W = ceil(V / 32)``: bit ``v % 32`` of word ``v // 32`` set
means token ``v`` is allowed in that row. ``-1`` (all bits set) is an unconstrained word.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_SHIFTS = torch.arange(32, dtype=torch.int64)


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """``[rows, W]`` int32 with every token allowed."""
    return torch.full((rows, bitmask_width(vocab_size)), -1, dtype=torch.int32)


def pack_allowed(allowed: torch.Tensor) -> torch.Tensor:
    """``allowed [..., V]`` bool -> ``[..., W]`` int32 (bits past ``V`` are 0)."""
    v = allowed.shape[-1]
    pad = bitmask_width(v) * 32 - v
    bits = torch.nn.functional.pad(allowed.to(torch.int64), (0, pad)).unflatten(-1, (-1, 32))
    words = (bits << _SHIFTS).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[..., W]`` int32 -> ``[..., V]`` bool."""
    bits = (bitmask.to(torch.int64).unsqueeze(-1) >> _SHIFTS) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def bitmask_of_ids(ids: Iterable[int], vocab_size: int) -> torch.Tensor:
    """``[W]`` int32 allowing exactly ``ids``."""
    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    idx = torch.tensor(sorted(set(ids)), dtype=torch.int64)
    if idx.numel():
        allowed[idx] = True
    return pack_allowed(allowed)


def token_allowed(row: torch.Tensor, token_id: int) -> bool:
    """Is ``token_id`` allowed by the bitmask row ``[W]``?"""
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)
