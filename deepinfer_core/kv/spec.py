"""Cache specs: the contract between a model and the engine's KV manager.

A model lists the state it keeps between steps as :class:`CacheSpec` objects. The engine groups
them by :attr:`CacheSpec.group`, gives each group its own paged pool and block table per request,
and sizes everything from one byte budget.

Geometry. A logical block covers ``block_size`` *tokens* for every spec. A spec that stores one entry
per ``tokens_per_entry`` tokens holds ``block_size // tokens_per_entry`` entries per block, so
``block_size`` is a multiple of every ``tokens_per_entry``. The pool of a spec is a tensor
``[num_blocks, block_size // tokens_per_entry, *entry_shape]``; entry ``e`` of a request lives at
``block_table[e * tokens_per_entry // block_size]`` and offset ``e % (block_size // tokens_per_entry)``.

Groups.
- ``"window"``: per-token state of which only the most recent tokens are read: sliding-window KV and
  the compressor's per-token projections (the *partial state* of a compression window, including
  CSA's overlap window). ``window`` says how many tokens *before* the first token of a step must
  still be readable. Blocks wholly older than that are released (block table entry ``-1``).
- ``"compressed"``: compressed KV and indexer keys, one entry per ``tokens_per_entry`` tokens,
  kept for the whole context.

All state is addressed by absolute position, so rolling a request back to ``n`` computed tokens
(speculative rejection, preemption) is just setting its length: positions ``>= n`` are rewritten
before they are read again. Prefix caching reuses a full block of every spec at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

CacheGroup = Literal["window", "compressed"]


@dataclass(frozen=True)
class CacheSpec:
    name: str  # unique, e.g. "layers.3.swa_kv", "layers.3.compressor.kv", "layers.3.indexer.keys"
    group: CacheGroup
    tokens_per_entry: int  # 1 for per-token state; the compression ratio for compressed entries
    entry_shape: tuple[int, ...]
    dtype: torch.dtype
    window: int = 0  # window group: tokens before a step's first token that must stay readable

    def entries_per_block(self, block_size: int) -> int:
        if block_size % self.tokens_per_entry:
            raise ValueError(
                f"block_size={block_size} must be a multiple of tokens_per_entry={self.tokens_per_entry} (spec {self.name})"
            )
        return block_size // self.tokens_per_entry

    def page_bytes(self, block_size: int) -> int:
        """Bytes one block of this spec occupies."""
        n = self.entries_per_block(block_size)
        for d in self.entry_shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


def required_block_multiple(specs: list[CacheSpec]) -> int:
    """The smallest block size every spec accepts (lcm of all ``tokens_per_entry``)."""
    import math

    out = 1
    for s in specs:
        out = math.lcm(out, s.tokens_per_entry)
    return out


def max_window(specs: list[CacheSpec]) -> int:
    return max((s.window for s in specs if s.group == "window"), default=0)
