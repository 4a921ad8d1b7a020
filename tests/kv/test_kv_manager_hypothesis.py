"""Random groups, windows, ratios, prompts sharing prefixes and chunkings: every windowed group holds exactly
the blocks its window still reads, no block a request writes is shared or cached, replayed groups never
enter the prefix cache, and every reference is accounted for."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_core.kv.kv_manager import KVCacheManager
from deepinfer_core.kv.spec import CacheSpec, required_block_multiple

from .test_kv_manager import Req

F32 = torch.float32

setup_st = st.fixed_dictionaries(
    {
        "windows": st.lists(st.integers(1, 70), min_size=1, max_size=3),
        "ratios": st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=2),
        "replay": st.integers(0, 40),
        "chunk": st.integers(4, 50),
        "seed": st.integers(0, 2**16),
    }
)


def _check(kv: KVCacheManager, req: Req) -> None:
    bs = kv.block_size
    for g, table in req.block_tables.items():
        first = 0 if kv.windows[g] is None else max(0, req.num_computed - kv.windows[g]) // bs
        assert all(b < 0 for b in table[:first]) and all(b >= 0 for b in table[first:]), (g, table)
        for b in table[req.num_computed // bs :]:
            assert kv.pools[g].ref[b] == 1 and kv.pools[g].hash[b] is None, f"{g}: shared block {b} written"
    for g in kv.replayed:
        assert not kv.pools[g].cached


@settings(max_examples=30, deadline=None)
@given(setup_st)
def test_tables_follow_each_group_s_window_under_any_chunking(setup):
    specs = [CacheSpec(f"w{i}", f"win{i}", 1, (1,), F32, window=w) for i, w in enumerate(setup["windows"])]
    specs += [CacheSpec(f"c{r}", "kept", r, (1,), F32) for r in setup["ratios"]]
    bs = 16 * required_block_multiple(specs)
    replayed = {"win0"} if setup["replay"] else set()
    kv = KVCacheManager(specs, bs, {s.group: 400 for s in specs}, True, replayed, setup["replay"])
    rng = random.Random(setup["seed"])
    base = [rng.randrange(4) for _ in range(200)]
    for _ in range(4):
        req = Req(base[: rng.randrange(1, 200)] + [rng.randrange(4) for _ in range(rng.randrange(30))])
        reused = kv.match_prefix(req)
        assert reused % bs == 0 and reused <= max(0, req.num_tokens - max(1, setup["replay"]))
        while req.num_computed < req.num_tokens:
            n = min(setup["chunk"], req.num_tokens - req.num_computed)
            assert kv.allocate(req, n)
            _check(kv, req)
            req.num_computed += n
            kv.commit(req)
            kv.check([req])
        kv.free(req)
        kv.check([])
