"""Block tables per request and per cache group, window release, and prefix caching.

Each group (an open set of names the model declares) has its own :class:`BlockPool`; a sequence has one
block table per group, indexed by logical block ``j`` (tokens ``j*block_size ... (j+1)*block_size - 1``).
What a group keeps follows from its specs (:func:`~deepinfer_core.kv.spec.group_windows`):

- a *kept* group: blocks are kept for the whole context.
- a *windowed* group: a block is only read while it overlaps the last ``window`` tokens before the next
  token to compute. Older blocks are released (table entry ``-1``; released entries always form a prefix
  of the table); if their content is hashed they stay in the pool as cached blocks, so a later request
  sharing the prefix can resume from them.

Prefix caching. Full blocks are keyed by a chain hash of all tokens up to the block's end. A request
resumes at ``k`` blocks when every group holds what resuming needs: kept blocks ``0..k-1`` and, for each
windowed group, the blocks overlapping ``[k*block_size - window, k*block_size)``. At most
``num_tokens - 1`` tokens are reused, so the step always computes at least one token and has logits.

Replayed groups (bounded replay, see :mod:`deepinfer_core.engine.layer_range`) hold state that the model
writes only on some rows of a chunk, so it is never offered to the prefix cache. A request resuming from
the cache gets fresh blocks for them and at least ``replay_tokens`` tokens to compute, which rebuild that
state before anything reads it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from deepinfer_core.kv.block_pool import BlockPool
from deepinfer_core.kv.request import KVRequest
from deepinfer_core.kv.spec import CacheSpec, group_windows

_ROOT_HASH = 0x5EED_DEE9


@dataclass
class CacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # tokens reused


class KVCacheManager:
    def __init__(
        self,
        specs: list[CacheSpec],
        block_size: int,
        num_blocks: dict[str, int],
        enable_caching: bool = True,
        replayed: Collection[str] = (),
        replay_tokens: int = 0,
    ):
        self.block_size = block_size
        self.enable_caching = enable_caching
        #: groups kept out of the prefix cache, and the tokens a hit leaves to rebuild them
        self.replayed, self.replay_tokens = frozenset(replayed), replay_tokens
        windows = group_windows(specs)
        groups = sorted(windows)
        self.pools = {g: BlockPool(num_blocks[g], enable_caching) for g in groups}
        #: tokens before the next token that must stay readable; None: keep everything
        self.windows: dict[str, int | None] = {g: windows[g] for g in groups}
        self.stats = CacheStats()
        self._pool_items = list(self.pools.items())
        self._windowed = [(g, w, self.pools[g]) for g, w in self.windows.items() if w is not None]
        self._cached = [(g, pool) for g, pool in self.pools.items() if g not in self.replayed]

    # ------------------------------------------------------------------ hashing

    def block_hashes(self, seq: KVRequest, num_blocks: int) -> list[int]:
        """Chain hashes of the first ``num_blocks`` full blocks of ``seq.token_ids`` (memoised on ``seq``), with
        the position and digest of every image span a block overlaps."""
        hashes, bs, toks = seq.block_hashes, self.block_size, seq.token_ids
        parent = hashes[-1] if hashes else _ROOT_HASH
        images = seq.image_keys
        for j in range(len(hashes), num_blocks):
            lo, hi = j * bs, (j + 1) * bs
            key = tuple(toks[lo:hi])
            if images:
                key += tuple((s, d) for s, e, d in images if s < hi and e > lo)
            parent = hash((parent, key))
            hashes.append(parent)
        return hashes

    def _first_needed(self, group: str, num_computed: int) -> int:
        """First logical block of ``group`` a step starting at ``num_computed`` reads."""
        w = self.windows[group]
        return 0 if w is None else max(0, num_computed - w) // self.block_size

    # ------------------------------------------------------------------ prefix caching

    def match_prefix(self, seq: KVRequest) -> int:
        """Give a sequence with nothing computed every cached block it can resume from; returns the
        number of tokens reused (a multiple of ``block_size``), also set as ``seq.num_computed``."""
        assert seq.num_computed == 0 and not seq.block_tables
        self.stats.queries += seq.num_tokens
        if not self.enable_caching or seq.wants_prompt_logprobs:
            return 0
        n = max(0, seq.num_tokens - max(1, self.replay_tokens)) // self.block_size
        hashes = self.block_hashes(seq, n)[:n]
        k = self._longest_resumable(hashes)
        for g, pool in self.pools.items():
            start = self._first_needed(g, k * self.block_size)
            table = [-1] * start
            for j in range(start, start if g in self.replayed else k):  # replayed: fresh blocks later
                b = pool.lookup(hashes[j])
                pool.acquire(b)
                table.append(b)
            seq.block_tables[g] = table
        seq.tables_version += 1
        seq.num_computed = k * self.block_size
        seq.num_committed_blocks = k
        self.stats.hits += seq.num_computed
        return seq.num_computed

    def _longest_resumable(self, hashes: list[int]) -> int:
        k = len(hashes)
        for g, pool in self._cached:
            if self.windows[g] is None:  # every block needed: the longest cached chain
                k = next((j for j in range(k) if pool.lookup(hashes[j]) is None), k)
        while k > 0:
            ok = all(
                pool.lookup(hashes[j]) is not None
                for g, pool in self._cached
                if self.windows[g] is not None
                for j in range(self._first_needed(g, k * self.block_size), k)
            )
            if ok:
                return k
            k -= 1
        return 0

    # ------------------------------------------------------------------ allocation

    def allocate(self, seq: KVRequest, num_new_tokens: int) -> bool:
        """Make room for computing ``num_new_tokens`` more tokens of ``seq``; first releases window blocks
        it will never read again. All-or-nothing: returns False (allocating nothing) if a pool is short."""
        bs = self.block_size
        tables = seq.block_tables
        for g, w, pool in self._windowed:  # one look at the table per windowed group
            stop = (seq.num_computed - w) // bs
            t = tables.get(g)
            if stop > 0 and t and t[min(stop, len(t)) - 1] >= 0:
                _release_prefix(t, min(stop, len(t)), pool)
                seq.tables_version += 1
        end_blocks = (seq.num_computed + num_new_tokens + bs - 1) // bs
        short = None
        for g, pool in self._pool_items:  # the hot path (decode inside a block) allocates nothing
            t = tables.get(g)
            need = end_blocks - (len(t) if t is not None else 0)
            if need > 0:
                if need > pool.num_available:
                    return False
                short = short or []
                short.append((g, pool, need))
        if short:
            for g, pool, need in short:
                tables.setdefault(g, []).extend(pool.allocate() for _ in range(need))
            seq.tables_version += 1
        return True

    def commit(self, seq: KVRequest) -> None:
        """Register the full blocks ``seq`` has computed so far in the prefix cache. Only blocks whose tokens
        are all known count: with overlap scheduling a step may have computed a token whose id is still
        pending on the device (``num_computed > num_tokens``), and a block is keyed by its tokens."""
        if not self.enable_caching:
            return
        num_full = min(seq.num_computed, seq.num_tokens) // self.block_size
        first = seq.num_committed_blocks
        if num_full <= first:
            return
        hashes = self.block_hashes(seq, num_full)
        for g, pool in self._cached:
            table = seq.block_tables.get(g, ())
            for j in range(first, min(num_full, len(table))):
                if table[j] >= 0:
                    pool.register(table[j], hashes[j])
        seq.num_committed_blocks = num_full

    def free(self, seq: KVRequest) -> None:
        """Drop every block of ``seq``; hashed ones stay cached (tail first in LRU order)."""
        for g, table in seq.block_tables.items():
            pool = self.pools[g]
            for b in reversed(table):
                if b >= 0:
                    pool.release(b)
        seq.block_tables = {}
        seq.num_committed_blocks = 0
        seq.tables_version += 1

    def check(self, seqs: list[KVRequest]) -> None:
        """Assert pool invariants and that references equal the live table entries (tests)."""
        for g, pool in self.pools.items():
            pool.check()
            refs = [0] * pool.num_blocks
            for s in seqs:
                for b in s.block_tables.get(g, ()):
                    if b >= 0:
                        refs[b] += 1
            assert refs == pool.ref, f"group {g}: block references do not match the block tables"


def _release_prefix(table: list[int], stop: int, pool: BlockPool) -> None:
    """Release ``table[:stop]``, oldest first (the LRU order of cached blocks). Entries already released
    (``-1``) form a prefix, so the first live one is found walking back from ``stop - 1``."""
    first = stop
    while first > 0 and table[first - 1] >= 0:
        first -= 1
    for j in range(first, stop):
        pool.release(table[j])
        table[j] = -1
