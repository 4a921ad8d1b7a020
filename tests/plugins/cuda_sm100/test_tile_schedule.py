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


@pytest.mark.parametrize(
    "T,k,E,block_m,lut_n",
    [
        (1, 6, 256, 16, 256),
        (5, 6, 16, 16, 20),
        (64, 6, 32, 16, 40),
        (3, 2, 8, 1, 8),
        (9, 8, 3, 4, 12),
        (1, 6, 256, 1, 256),
        (16, 6, 256, 1, 300),
    ],
)
def test_one_launch_schedule_equals_the_torch_schedule(T, k, E, block_m, lut_n):
    """The decode-size schedule kernel gives exactly the torch schedule, with the expert lookup (ids past
    the table and experts another rank owns -> -1), the source rows and the gathered weights; one-row tiles
    (decode) end after their own row, not at their expert's end (the same rows either way)."""
    from deepinfer_cuda_sm100.kernels.grouped_gemm import tile_schedule
    from deepinfer_cuda_sm100.kernels.schedule import moe_schedule

    from .cuda_sm100_helpers import dev

    g = torch.Generator().manual_seed(T * 100 + E)
    ids = torch.randint(-1, lut_n + 2, (T, k), generator=g)  # -1 and ids past the table included
    lut = torch.arange(lut_n)
    lut = torch.where(lut < E, lut, -1)
    lut[torch.randperm(lut_n, generator=g)[: lut_n // 4]] = -1  # another rank's experts
    w = torch.rand(T, k, generator=g)
    got = moe_schedule(*dev(ids, lut, w), E, block_m)
    flat = ids.reshape(-1)
    known = (flat >= 0) & (flat < lut_n)
    local = torch.where(known, lut[flat.clamp(0, lut_n - 1)], -1)
    order, *sched = tile_schedule(local, E, block_m)
    want = (order, order // k, w.reshape(-1)[order], *sched)
    if block_m == 1:
        used = want[3] >= 0
        want = (*want[:5], torch.where(used, want[4] + 1, got[5].cpu()))
        assert torch.equal(got[3].cpu() >= 0, used)
    for name, a, b in zip(("order", "a_idx", "row_w", "expert", "start", "end"), got, want):
        assert torch.equal(a.cpu(), b), name


def test_schedule_kernel_leaves_large_problems_to_torch():
    from deepinfer_cuda_sm100.kernels.schedule import MAX_ROWS, moe_schedule

    ids = torch.zeros(MAX_ROWS // 2 + 1, 2, dtype=torch.int64)
    assert moe_schedule(ids, torch.arange(4), torch.ones(ids.shape), 4, 16) is None
