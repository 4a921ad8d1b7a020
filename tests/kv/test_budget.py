"""Sizing pools from one byte budget for any set of groups, in exact bytes."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.kv.budget import KVBudgetError, group_block_bytes, kv_footprint, min_blocks, plan_kv
from deepinfer_core.kv.packed import PackedFormat
from deepinfer_core.kv.spec import CacheSpec

F32 = torch.float32
BS = 16


def _specs() -> list[CacheSpec]:
    return [
        CacheSpec("swa", "ring", 1, (8,), F32, window=63),
        CacheSpec("state", "partial", 1, (2, 8), F32, window=1),
        CacheSpec.packed_entries("ckv", "global", 2, PackedFormat("e2m1", "e4m3", 16, (32,))),
        CacheSpec("keys", "global", 4, (8,), torch.bfloat16),
        CacheSpec("hca", "sparse", 128, (8,), F32),
    ]


def test_a_block_costs_the_exact_bytes_of_its_group_s_entries():
    assert group_block_bytes(_specs(), 128) == {
        "ring": 128 * 32,
        "partial": 128 * 64,
        "global": 64 * (16 + 2) + 32 * 16,
        "sparse": 1 * 32,
    }


def test_what_one_request_needs_follows_each_group_s_retention():
    need = min_blocks(_specs(), BS, max_model_len=1000, max_chunk=256)
    assert need == {
        "ring": -(-(63 + 256) // BS) + 1,
        "partial": -(-(1 + 256) // BS) + 1,
        "global": -(-1000 // BS),
        "sparse": -(-1000 // BS),
    }


def test_kept_groups_grow_together_and_windowed_ones_by_the_same_fraction():
    specs = _specs()
    nbytes = group_block_bytes(specs, 128)
    need = min_blocks(specs, 128, 1024, 256)
    need_bytes = sum(need[g] * nbytes[g] for g in need)
    budget = need_bytes + 5 * nbytes["ring"] + 3 * nbytes["partial"]  # far from the windowed targets
    layout = plan_kv(specs, 128, budget, 1024, max_num_seqs=8, max_num_batched_tokens=256)
    ring, partial = (layout.num_blocks[g] - need[g] for g in ("ring", "partial"))
    target = 8 * 2 + 2 - need["ring"]  # both windows fit in one block: the same target for both
    assert ring == partial and 0 < ring < target
    kept = [layout.num_blocks[g] - need[g] for g in ("global", "sparse")]
    assert kept[0] == kept[1] and layout.total_bytes <= budget
    assert budget - layout.total_bytes < nbytes["global"] + nbytes["sparse"]  # the rest went to them
    big = plan_kv(specs, 128, 10**9, 1024, max_num_seqs=8, max_num_batched_tokens=256)
    assert big.num_blocks["global"] == big.num_blocks["sparse"] == 8 * need["global"]
    assert big.num_blocks["ring"] == need["ring"] + target


def test_a_budget_short_of_one_request_names_every_group():
    with pytest.raises(KVBudgetError, match="blocks of .* bytes.*sparse blocks"):
        plan_kv(_specs(), 128, 1000, 1024, 8, 256)


def test_footprint_counts_kept_bytes_per_token_and_a_full_window_per_request():
    fp = kv_footprint(_specs())
    assert fp.bytes_per_token == (16 + 2) / 2 + 16 / 4 + 32 / 128
    assert fp.window_bytes == 64 * 32 + 2 * 64
