"""One group's pool of KV blocks: reference counts, prefix-cache index, LRU eviction.

Every block is in exactly one state:

- *free*: ``ref == 0``, no hash, in :attr:`free` (content meaningless);
- *cached*: ``ref == 0`` with a hash, in :attr:`evictable` (LRU order, oldest first): its content is a
  computed prefix block that a later request may reuse; it is reclaimed when the free list is empty;
- *in use*: ``ref > 0`` (shared by every sequence whose block table holds it), hash or not.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.cached: dict[int, int] = {}  # hash -> block id

    @property
    def num_available(self) -> int:
        """Blocks :meth:`allocate` can hand out now (free, or cached and unreferenced)."""
        return len(self.free) + len(self.evictable)

    @property
    def num_in_use(self) -> int:
        return self.num_blocks - self.num_available

    def allocate(self) -> int:
        if self.free:
            b = self.free.popleft()
        else:
            b, _ = self.evictable.popitem(last=False)
            del self.cached[self.hash[b]]
            self.hash[b] = None
        self.ref[b] = 1
        return b

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def acquire(self, block: int) -> None:
        """Take a reference to a cached block (found by :meth:`lookup`)."""
        if self.ref[block] == 0:
            del self.evictable[block]
        self.ref[block] += 1

    def release(self, block: int) -> None:
        r = self.ref[block] - 1
        assert r >= 0, f"block {block} released more often than acquired"
        self.ref[block] = r
        if r == 0:
            if self.hash[block] is not None:
                self.evictable[block] = None
            else:
                self.free.append(block)

    def register(self, block: int, block_hash: int) -> None:
        """Record that ``block`` (in use, fully computed) holds the prefix block ``block_hash``. If another
        block already holds it (two requests computed the same prefix at once), this one stays private."""
        if not self.enable_caching or self.hash[block] is not None or block_hash in self.cached:
            return
        self.hash[block] = block_hash
        self.cached[block_hash] = block

    def reset_cache(self) -> None:
        """Forget every cached, unreferenced block (e.g. after weights change)."""
        for b in list(self.evictable):
            del self.cached[self.hash[b]]
            self.hash[b] = None
            self.free.append(b)
        self.evictable.clear()

    def check(self) -> None:
        """Assert the invariants of the module docstring (tests)."""
        free = set(self.free)
        assert len(free) == len(self.free), "block twice in the free list"
        assert not free & set(self.evictable), "block both free and cached"
        for b in range(self.num_blocks):
            if b in free:
                assert self.ref[b] == 0 and self.hash[b] is None, f"free block {b} referenced or hashed"
            elif b in self.evictable:
                assert self.ref[b] == 0 and self.hash[b] is not None, (
                    f"cached block {b} referenced or unhashed"
                )
            else:
                assert self.ref[b] > 0, f"block {b} leaked: not free, not cached, not referenced"
        for h, b in self.cached.items():
            assert self.hash[b] == h
