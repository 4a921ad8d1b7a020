"""The grouped GEMM's device-side tile schedule: every local row lands in exactly one tile of its expert."""

from __future__ import annotations

import pytest
import torch

from .cuda_sm100_helpers import needs_triton

pytestmark = needs_triton


@pytest.mark.parametrize("block_m", [1, 4, 16])
def test_tiles_cover_each_local_row_once(block_m):
    from deepinfer_cuda_sm100.kernels.grouped_gemm import tile_schedule

    g = torch.Generator().manual_seed(3)
    num_experts = 5
    local = torch.randint(-1, num_experts, (57,), generator=g)
    order, tile_e, t0, t1 = tile_schedule(local, num_experts, block_m)
    assert tile_e.numel() == min(-(-57 // block_m) + num_experts, 57)  # static bound, no host sync
    sorted_ids = local[order]
    seen = torch.zeros(57, dtype=torch.int64)
    for e, a, b in zip(tile_e.tolist(), t0.tolist(), t1.tolist()):
        if e < 0:
            continue
        rows = range(a, min(a + block_m, b))
        assert len(rows) > 0
        assert all(int(sorted_ids[r]) == e for r in rows)
        for r in rows:
            seen[order[r]] += 1
    assert torch.equal(seen, (local >= 0).long())
