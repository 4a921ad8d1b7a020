"""Cache specs: the contract between a model and the engine's KV manager.

A model lists the state it keeps between steps as :class:`CacheSpec` objects. The engine groups
them by :attr:`CacheSpec.group`, gives each group its own paged pool and block table per request,
and sizes everything from one byte budget. The runner allocates one pool tensor per spec.

Geometry. A logical block covers ``block_size`` *tokens* for every spec. A spec that stores one entry
per ``tokens_per_entry`` tokens (any ratio: 1, 2, 4, 128, ...) holds ``block_size // tokens_per_entry``
entries per block, so ``block_size`` is a multiple of every ``tokens_per_entry``. The pool of a spec is a
tensor ``[num_blocks, block_size // tokens_per_entry, *entry_shape]``; entry ``e`` of a request lives at
``block_table[e * tokens_per_entry // block_size]`` and offset ``e % (block_size // tokens_per_entry)``.
A packed spec (:attr:`CacheSpec.packed`, see :mod:`.packed`) has ``entry_shape == (entry_bytes,)`` and
``dtype == uint8``: its pool holds exactly the bytes of the format.

Groups are an open set of names the model chooses. What the engine keeps of a group follows from its
specs, never from its name (:func:`group_windows`):

- every spec has ``window > 0``: per-token state of which only recent tokens are read (sliding-window KV,
  the partial state of a compression window). ``window`` says how many tokens *before* the first token of
  a step must still be readable; the group keeps the largest. Blocks wholly older than that are released
  (block table entry ``-1``).
- otherwise (some spec has ``window == 0``): the group is kept for the whole context (compressed KV,
  indexer keys, global KV).

Writers and readers. A spec may say which layer writes it (:attr:`CacheSpec.writer`) and which layers
read it (:attr:`CacheSpec.readers`), for example compressed KV that one source layer publishes and
later layers reuse. Layers run in order within a step, so every reader comes at or after the writer.
:func:`check_specs` validates a model's specs once, when the engine is built.

All state is addressed by absolute position, so rolling a request back to ``n`` computed tokens
(speculative rejection, preemption) is just setting its length: positions ``>= n`` are rewritten
before they are read again. Prefix caching reuses a full block of every spec at once.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

import torch

from deepinfer_core.kv.packed import PackedFormat


@dataclass(frozen=True)
class CacheSpec:
    name: str  # unique, e.g. "layers.3.swa_kv", "layers.3.compressor.kv", "layers.3.indexer.keys"
    group: str  # any name the model chooses; specs of one group share block tables
    tokens_per_entry: int  # 1 for per-token state; the compression ratio for compressed entries
    entry_shape: tuple[int, ...]
    dtype: torch.dtype
    window: int = 0  # tokens before a step's first token that must stay readable; 0: all of them
    writer: int | None = None  # the layer that writes the entries (None: not declared)
    readers: tuple[int, ...] = ()  # the layers that read them, ascending
    packed: PackedFormat | None = None  # entries are this packed format's bytes

    def __post_init__(self) -> None:
        if self.tokens_per_entry < 1 or self.window < 0:
            raise ValueError(
                f"cache spec {self.name}: tokens_per_entry={self.tokens_per_entry} must be >= 1 and "
                f"window={self.window} >= 0"
            )
        if self.packed is not None and (
            self.entry_shape != (self.packed.entry_bytes,) or self.dtype != torch.uint8
        ):
            raise ValueError(
                f"cache spec {self.name}: a packed {self.packed.name} entry is uint8 ({self.packed.entry_bytes},), "
                f"got {self.dtype} {self.entry_shape}; build it with CacheSpec.packed_entries"
            )
        if self.readers and self.writer is None:
            raise ValueError(f"cache spec {self.name}: readers {self.readers} need a writer")
        if list(self.readers) != sorted(set(self.readers)):
            raise ValueError(f"cache spec {self.name}: readers {self.readers} must be ascending and distinct")
        if self.writer is not None and (self.writer < 0 or any(r < self.writer for r in self.readers)):
            raise ValueError(
                f"cache spec {self.name}: writer {self.writer} must be >= 0 and come at or before every "
                f"reader {self.readers} (layers run in order)"
            )

    @classmethod
    def packed_entries(
        cls,
        name: str,
        group: str,
        tokens_per_entry: int,
        fmt: PackedFormat,
        *,
        window: int = 0,
        writer: int | None = None,
        readers: tuple[int, ...] = (),
    ) -> CacheSpec:
        """A spec whose entries are ``fmt``'s bytes (a ``uint8`` pool, ``fmt.entry_bytes`` per entry)."""
        return cls(
            name, group, tokens_per_entry, (fmt.entry_bytes,), torch.uint8, window, writer, readers, fmt
        )

    def entries_per_block(self, block_size: int) -> int:
        if block_size % self.tokens_per_entry:
            raise ValueError(
                f"block_size={block_size} must be a multiple of tokens_per_entry={self.tokens_per_entry} (spec {self.name})"
            )
        return block_size // self.tokens_per_entry

    @property
    def entry_bytes(self) -> int:
        """Bytes of one entry, exactly (a packed entry has no padding)."""
        return math.prod(self.entry_shape) * torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_token(self) -> Fraction:
        """``entry_bytes / tokens_per_entry``, exact."""
        return Fraction(self.entry_bytes, self.tokens_per_entry)

    def page_bytes(self, block_size: int) -> int:
        """Bytes one block of this spec occupies."""
        return self.entries_per_block(block_size) * self.entry_bytes


def required_block_multiple(specs: list[CacheSpec]) -> int:
    """The smallest block size every spec accepts (lcm of all ``tokens_per_entry``)."""
    return math.lcm(1, *(s.tokens_per_entry for s in specs))


def group_windows(specs: list[CacheSpec]) -> dict[str, int | None]:
    """Per group: the largest ``window`` when every spec of the group has one (> 0), so blocks older than it
    are released; ``None`` when some spec needs the whole context."""
    out: dict[str, int | None] = {}
    for s in specs:
        w = out.get(s.group, s.window)
        out[s.group] = None if w is None or not s.window else max(w, s.window)
    return out


def check_specs(specs: list[CacheSpec], num_layers: int | None = None) -> None:
    """Check a model's specs as a whole: unique names and, when the model numbers its layers
    (``num_layers``), a writer and readers that exist. Raises ``ValueError``."""
    twice = sorted(n for n, k in Counter(s.name for s in specs).items() if k > 1)
    if twice:
        raise ValueError(f"cache spec names must be unique: {twice} appear more than once")
    if num_layers is None:
        return
    for s in specs:
        layers = ([] if s.writer is None else [s.writer]) + list(s.readers)
        if any(not 0 <= i < num_layers for i in layers):
            raise ValueError(
                f"cache spec {s.name}: writer {s.writer} / readers {s.readers} name a layer outside "
                f"0..{num_layers - 1}"
            )
