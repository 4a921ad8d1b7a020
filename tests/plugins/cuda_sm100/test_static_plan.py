"""The plugin's static plan (``kernels.static_plan``: ``device_plan``'s tables in three launches) against the core's
composition of torch ops, which ``tests/models/deepseek_v4/test_addressing_static.py`` holds to the host plan:
every table equal, int64, on random static batches: padding rows and padding requests (position -1), windows
reaching before position 0, entries closing and not, released blocks in both groups, candidate tables wider
than one program's chunk of columns."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.compose import compose_static_plan
from tests.models.deepseek_v4.test_addressing_static import _static_batch

from .cuda_sm100_helpers import DEVICE, needs_triton

pytestmark = needs_triton


def _tables(batch, kinds, window, bucket):
    t, b = batch.positions.shape[0], batch.context_lens.shape[0]
    args = (
        batch.positions.to(DEVICE),
        batch.block_tables["window"].to(DEVICE),
        batch.block_tables["compressed"].to(DEVICE),
        max(1, t // b),
        window,
        kinds,
        bucket,
        batch.block_size,
    )
    from deepinfer_cuda_sm100.kernels.static_plan import static_plan

    return static_plan(*args), compose_static_plan(None, *args)


def _flat(out):
    req, token, window, tables = out
    return [req, token, window, *(x for kind in tables for x in kind)]


@pytest.mark.parametrize(
    "q, kinds", [(1, ((4, True), (16, False))), (3, ((4, True), (16, False))), (2, ((1, False), (2, False)))]
)
def test_the_kernels_tables_equal_the_composition(q, kinds):
    """V4's kinds (ratio 4 overlapped, 16) and V4.1's (ratios without overlap, 1 and 2 among them)."""
    g = torch.Generator().manual_seed(7 + q)
    for _ in range(3):
        starts = torch.randint(0, 2000 - q, (5,), generator=g).tolist() + [0, 3, 15]
        batch = _static_batch(g, starts, q, bucket=10, context=2048)
        for group, row, col in (("window", 0, starts[0] // 16), ("compressed", 1, 0), ("compressed", 2, 5)):
            batch.block_tables[group][row, col] = -1  # released
        got, want = _tables(
            batch, kinds, 8, 2048
        )  # ratio 4: 512 candidate columns (ratio 1: 2,048, two chunks)
        assert got[3][0][3].shape == (10 * q, 2048 // kinds[0][0])
        for a, b in zip(_flat(got), _flat(want), strict=True):
            assert a.dtype == torch.int64 and a.shape == b.shape
            assert torch.equal(a.cpu(), b.cpu())
        assert bool((want[3][0][0] >= 0).any()) and bool(
            (want[3][0][0] == -1).any()
        )  # entries close, and not
    # tables narrower than the bucket (the contract asks for at least its width): positions past their last
    # column read the absent block, as the composition's padded column does
    for group in ("window", "compressed"):
        batch.block_tables[group] = batch.block_tables[group][:, :100].contiguous()
    got, want = _tables(batch, kinds, 8, 2048)
    assert bool((want[2] == -1).any()) and bool((want[3][0][3] < -1).any())
    for a, b in zip(_flat(got), _flat(want), strict=True):
        assert torch.equal(a.cpu(), b.cpu())


def test_candidates_over_several_chunks_and_a_window_of_128(monkeypatch):
    """V4-Flash's shape: window 128, ratios 4 (overlapped) and 128, block size 128; a 16k bucket: 4,096
    candidate columns of ratio 4, four chunks a row."""
    g = torch.Generator().manual_seed(3)
    import tests.models.deepseek_v4.test_addressing_static as helpers

    monkeypatch.setattr(helpers, "BS", 128)
    batch = _static_batch(g, [0, 127, 128, 4095, 9000, 16000], 1, bucket=8, context=16384)
    batch.block_tables["compressed"][4, 3] = -1
    got, want = _tables(batch, ((4, True), (128, False)), 128, 16384)
    assert got[3][0][3].shape == (8, 4096)
    for a, b in zip(_flat(got), _flat(want), strict=True):
        assert torch.equal(a.cpu(), b.cpu())
    assert bool((want[3][0][3][4] < -1).any())  # the released block's candidates read nothing
