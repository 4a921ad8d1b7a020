"""The KV manager with any set of groups: each windowed group releases what its own window no longer
reads, prefix caching resumes only where every cached group holds what resuming needs, and replayed
groups stay out of the prefix cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer_core.kv.kv_manager import KVCacheManager
from deepinfer_core.kv.spec import CacheSpec

BS = 16
F32 = torch.float32


@dataclass
class Req:
    token_ids: list[int]
    num_computed: int = 0
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    block_hashes: list[int] = field(default_factory=list)
    image_keys: tuple = ()
    num_committed_blocks: int = 0
    tables_version: int = 0
    wants_prompt_logprobs: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def _specs() -> list[CacheSpec]:
    return [
        CacheSpec("swa", "long", 1, (4,), F32, window=40),
        CacheSpec("state", "short", 1, (4,), F32, window=3),
        CacheSpec("ckv", "global", 2, (4,), F32),
        CacheSpec("keys", "global", 4, (4,), F32),
    ]


def _manager(**kw) -> KVCacheManager:
    return KVCacheManager(_specs(), BS, {"long": 64, "short": 64, "global": 64}, **kw)


def _run(kv: KVCacheManager, req: Req, chunk: int) -> None:
    """Compute ``req``'s prompt in chunks of ``chunk`` tokens, committing full blocks after each."""
    while req.num_computed < req.num_tokens:
        n = min(chunk, req.num_tokens - req.num_computed)
        assert kv.allocate(req, n)
        req.num_computed += n
        kv.commit(req)


def _released(table: list[int]) -> int:
    return next((j for j, b in enumerate(table) if b >= 0), len(table))


def test_each_windowed_group_releases_what_its_own_window_no_longer_reads():
    kv = _manager()
    req = Req(list(range(200)))
    _run(kv, req, 24)
    assert kv.windows == {"global": None, "long": 40, "short": 3}
    kv.allocate(req, 1)  # the next step starts at 200
    assert _released(req.block_tables["long"]) == (200 - 40) // BS
    assert _released(req.block_tables["short"]) == (200 - 3) // BS
    assert _released(req.block_tables["global"]) == 0
    kv.check([req])


def test_released_blocks_are_cached_oldest_first():
    kv = _manager()
    req = Req(list(range(100)))
    _run(kv, req, 100)
    blocks = list(req.block_tables["short"][:6])
    kv.allocate(req, 1)
    assert list(kv.pools["short"].evictable) == blocks


def test_a_hit_restores_every_group_from_its_own_first_needed_block():
    kv = _manager()
    first = Req(list(range(150)))
    _run(kv, first, 32)
    kv.free(first)
    second = Req(list(range(130)) + [7] * 30)
    assert kv.match_prefix(second) == 128
    tables = second.block_tables
    assert _released(tables["long"]) == (128 - 40) // BS and len(tables["long"]) == 8
    assert _released(tables["short"]) == (128 - 3) // BS
    assert _released(tables["global"]) == 0 and len(tables["global"]) == 8
    assert kv.allocate(second, 32)
    kv.check([second])


def test_a_hit_needs_the_window_blocks_of_every_windowed_group():
    kv = _manager()
    first = Req(list(range(150)))
    _run(kv, first, 150)
    kv.free(first)
    # drop the cached "short" block 8 (tokens 128..143): resuming at 9 blocks needs it, at 8 it does not
    pool = kv.pools["short"]
    victim = pool.lookup(first.block_hashes[8])
    del pool.evictable[victim], pool.cached[pool.hash[victim]]
    pool.hash[victim] = None
    pool.free.append(victim)
    assert kv.match_prefix(Req(list(range(150)))) == 8 * BS


def test_replayed_groups_stay_out_of_the_cache_and_a_hit_leaves_the_replay_to_compute():
    kv = _manager(replayed={"short"}, replay_tokens=40)
    first = Req(list(range(150)))
    _run(kv, first, 32)
    assert not kv.pools["short"].cached and kv.pools["long"].cached
    kv.free(first)
    second = Req(list(range(150)))
    reused = kv.match_prefix(second)
    assert reused == (150 - 40) // BS * BS == 96
    assert second.block_tables["short"] == [-1] * ((96 - 3) // BS)  # no shared block: fresh ones follow
    assert kv.allocate(second, 150 - 96)
    assert all(kv.pools["short"].ref[b] == 1 for b in second.block_tables["short"] if b >= 0)
    assert len(second.block_tables["short"]) == len(second.block_tables["global"])
    kv.check([second])
