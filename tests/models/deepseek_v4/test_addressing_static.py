"""Static-mode slot tables (graph replay): the same slots as dynamic mode, padded; the candidate tables
are built from the block table by ``to()``; a missing block is still refused on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepinfer_core.models.batch import ForwardBatch
from deepinfer_core.models.deepseek_v4 import addressing
from deepinfer_core.models.deepseek_v4.addressing import StepAddressing

BS = 16
KINDS = ((4, True), (16, False))


def _batch(positions: list[int], cmp_tables: list[list[int]]) -> ForwardBatch:
    n = len(positions)
    width = max(len(t) for t in cmp_tables)
    cmp = torch.tensor([t + [-1] * (width - len(t)) for t in cmp_tables])
    win = torch.arange(n)[:, None] * 8 + torch.arange(width)[None, :]  # every window block present
    pos = torch.tensor(positions)
    return ForwardBatch(
        input_ids=torch.zeros(n, dtype=torch.int64),
        positions=pos,
        query_start_loc=torch.arange(n + 1),
        context_lens=pos + 1,
        block_tables={"window": win, "compressed": cmp},
        block_size=BS,
        logits_indices=torch.arange(n),
    )


def test_static_tables_equal_the_dynamic_ones_padded():
    g = torch.Generator().manual_seed(0)
    positions = [5, 63, 64, 100, 3]
    tables = [torch.randperm(40, generator=g)[: p // BS + 1].tolist() for p in positions]
    batch = _batch(positions, tables)
    dyn = StepAddressing(batch, sliding_window=8, kinds=KINDS)
    static = StepAddressing(batch, sliding_window=8, kinds=KINDS, context_bucket=256).to(torch.device("cpu"))
    assert torch.equal(static.token_slots, dyn.token_slots)
    assert torch.equal(static.window_slots, dyn.window_slots)
    for ratio, overlap in KINDS:
        d, s = dyn.compression(ratio, overlap), static.compression(ratio, overlap)
        assert s.cand_slots.shape == (len(positions), 256 // ratio)
        width = d.cand_slots.shape[1]
        assert torch.equal(s.cand_slots[:, :width], d.cand_slots)
        assert bool((s.cand_slots[:, width:] == -1).all())
        closing = torch.nonzero((torch.tensor(positions) + 1) % ratio == 0).flatten()
        assert torch.equal(s.entry_slots[closing], d.entry_slots)
        assert torch.equal(s.src_slots[closing], d.src_slots)
        others = torch.ones(len(positions), dtype=torch.bool)
        others[closing] = False
        assert bool((s.entry_slots[others] == -1).all()) and bool((s.src_slots[others] == -1).all())


def test_static_mode_refuses_a_released_compressed_block_on_the_host():
    batch = _batch([40], [[0, -1, 2]])  # entries 0..9 of ratio 4 live in blocks 0..2; block 1 is gone
    with pytest.raises(RuntimeError, match="no 'compressed' block for position 16"):
        StepAddressing(batch, sliding_window=8, kinds=((4, True),), context_bucket=256)


def test_moving_to_another_device_packs_every_table_into_one_copy_and_keeps_their_shapes():
    """``to()`` on a device other than the batch's (here ``meta``) goes through ``move_together``'s packed
    copy; every table, including the deferred candidates built there, keeps its shape and dtype."""
    batch = _batch([5, 63, 100], [[0], [1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11]])
    for bucket in (None, 256):
        addr = StepAddressing(batch, sliding_window=8, kinds=KINDS, context_bucket=bucket)
        here, there = addr.to(torch.device("cpu")), addr.to(torch.device("meta"))
        for a, b in zip(here.tensors(), there.tensors(), strict=True):
            assert b.device.type == "meta" and a.shape == b.shape and a.dtype == b.dtype
    moved = batch.to(torch.device("meta"))
    assert moved.block_tables["compressed"].shape == batch.block_tables["compressed"].shape
    assert moved.input_ids.device.type == "meta" and moved.logits_indices.shape == batch.logits_indices.shape


def _candidates_by_hand(positions: list[int], tables: list[list[int]], ratio: int) -> list[list[int]]:
    """The docstring's rule, one entry at a time: entry ``e < (p + 1) // r`` of request ``b`` lives in block
    ``table[b][e * r // BS]`` at offset ``e % (BS // r)``."""
    epb = BS // ratio
    return [
        [tables[b][e * ratio // BS] * epb + e % epb for e in range((p + 1) // ratio)]
        for b, p in enumerate(positions)
    ]


@pytest.mark.parametrize("on_host", [False, True])
def test_candidate_tables_are_built_as_the_rule_says_deferred_or_on_the_host(monkeypatch, on_host):
    """A large ``[T, C]`` candidate table (over ``HOST_CANDIDATES`` entries: a prefill chunk's) is not kept on
    the host: ``to()`` builds it (the device, in the engine), and a host addressing used directly builds it on
    first use; a small one (a decode step's) is built on the host with the other tables. All equal the slots
    counted out entry by entry, ``-1`` past each row's visible entries."""
    monkeypatch.setattr(addressing, "HOST_CANDIDATES", 1 << 14 if on_host else 0)
    g = torch.Generator().manual_seed(1)
    positions = [5, 63, 64, 100, 3, 47]
    tables = [torch.randperm(40, generator=g)[: p // BS + 1].tolist() for p in positions]
    addr = StepAddressing(_batch(positions, tables), sliding_window=8, kinds=KINDS)
    assert all((c.cand_slots is not None) == on_host for c in addr._compressions.values())
    moved = addr.to(torch.device("cpu"))
    for ratio, overlap in KINDS:
        want = _candidates_by_hand(positions, tables, ratio)
        width = max(len(w) for w in want)
        for got in (
            moved.compression(ratio, overlap).cand_slots,
            addr.compression(ratio, overlap).cand_slots,
        ):
            assert got.shape == (len(positions), width)
            assert got.tolist() == [w + [-1] * (width - len(w)) for w in want]


def test_a_prefill_step_refuses_a_released_compressed_block_on_the_host():
    batch = _batch([40], [[0, -1, 2]])
    with pytest.raises(RuntimeError, match="no 'compressed' block for position 16"):
        StepAddressing(batch, sliding_window=8, kinds=((4, True),))


def test_the_host_candidate_table_equals_the_device_one_on_random_tables():
    """``_candidate_slots_host`` (numpy) and ``candidate_slots`` (torch) on random block tables with released
    blocks (``-1``) and rows of every length: equal everywhere, the padding and past-visible columns included."""
    g = torch.Generator().manual_seed(7)
    for ratio in (1, 4, 16):
        T, cols = 9, 12
        table = torch.randint(0, 50, (T, cols), generator=g)
        table[torch.rand(T, cols, generator=g) < 0.2] = -1
        pos = torch.randint(0, cols * BS, (T,), generator=g)
        req = torch.randint(0, T, (T,), generator=g)
        width = cols * BS // ratio + 3
        dev = addressing.candidate_slots(table, req, pos, ratio, width, BS)
        host = addressing._candidate_slots_host(table.numpy(), req.numpy(), pos.numpy(), ratio, width, BS)
        assert host.dtype == np.int64 and torch.equal(torch.from_numpy(host), dev)


@pytest.mark.parametrize("bucket", [None, 256])
def test_the_batch_carries_its_plan_in_its_own_copy(monkeypatch, bucket):
    """``ForwardBatch.to`` packs the plan's tables (``host_tensors``) into the batch's one copy: a single
    ``move_together`` for both, and the moved plan equal to the plan's own ``.to``, deferred candidates
    included (``HOST_CANDIDATES`` 0: built where the step runs)."""
    from deepinfer_core.models import batch as batch_module

    monkeypatch.setattr(addressing, "HOST_CANDIDATES", 0)
    g = torch.Generator().manual_seed(3)
    positions = [5, 63, 64, 100]
    tables = [torch.randperm(40, generator=g)[: p // BS + 1].tolist() for p in positions]
    batch = _batch(positions, tables)
    batch.plan = StepAddressing(batch, sliding_window=8, kinds=KINDS, context_bucket=bucket)
    calls = []
    real = batch_module.move_together
    monkeypatch.setattr(batch_module, "move_together", lambda ts, d: calls.append(len(ts)) or real(ts, d))
    moved = batch.to(torch.device("meta"))
    assert len(calls) == 1 and calls[0] == 5 + 2 + len(batch.plan.host_tensors())
    alone = batch.plan.to(torch.device("meta"))
    for a, b in zip(moved.plan.tensors(), alone.tensors(), strict=True):
        assert a.device.type == "meta" and a.shape == b.shape and a.dtype == b.dtype
    here = batch.to(torch.device("cpu"))  # on the batch's own device: the same tables as the plan's .to
    for a, b in zip(here.plan.tensors(), batch.plan.to(torch.device("cpu")).tensors(), strict=True):
        assert torch.equal(a, b)


def _static_batch(g, starts: list[int], q: int, bucket: int, context: int) -> ForwardBatch:
    """Sequence ``b < len(starts)`` computes ``q`` rows from ``starts[b]`` (its last ``b % q`` rows padding,
    position -1), the rest of the ``bucket`` sequences are all padding; block tables ``context / BS`` wide,
    the blocks each sequence needs present (random ids), the rest absent."""
    width = context // BS
    pos, tables = [], {"window": [], "compressed": []}
    for b in range(bucket):
        real = q - b % q if b < len(starts) else 0
        start = starts[b] if b < len(starts) else 0
        pos += list(range(start, start + real)) + [-1] * (q - real)
        need = (start + real + BS - 1) // BS if real else 0
        for group in tables:
            ids = torch.randperm(200, generator=g)[:need].tolist()
            tables[group].append(ids + [-1] * (width - need))
    positions = torch.tensor(pos)
    return ForwardBatch(
        input_ids=torch.zeros(bucket * q, dtype=torch.int64),
        positions=positions,
        query_start_loc=torch.arange(0, (bucket + 1) * q, q),
        context_lens=torch.zeros(bucket, dtype=torch.int64),
        block_tables={k: torch.tensor(v) for k, v in tables.items()},
        block_size=BS,
        logits_indices=torch.arange(bucket * q),
    )


@pytest.mark.parametrize("q", [1, 3])
def test_the_device_built_static_tables_equal_the_host_ones(q):
    """``StepAddressing.static_on_device`` (tensor ops on the batch, what a captured step holds) gives every
    table of the host's static plan, exactly: random positions (entries closing and not, windows reaching
    before position 0), padding rows and padding sequences, ratios 4 (overlapped) and 16."""
    g = torch.Generator().manual_seed(11)
    for _ in range(5):
        starts = torch.randint(0, 250 - q, (5,), generator=g).tolist() + [0, 3, 15]
        batch = _static_batch(g, starts, q, bucket=10, context=256)
        host = StepAddressing(batch, sliding_window=8, kinds=KINDS, context_bucket=256).to(
            torch.device("cpu")
        )
        dev = StepAddressing.static_on_device(batch, sliding_window=8, kinds=KINDS, context_bucket=256)
        assert torch.equal(dev.req, host.req)
        for a, b in zip(dev.tensors(), host.tensors(), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


def test_the_device_built_tables_never_address_an_absent_block():
    """Where the host refuses a released block, the device-built tables write slot ``-1`` (the scratch slot)
    and read nothing (a negative slot), never another block's slot."""
    g = torch.Generator().manual_seed(5)
    batch = _static_batch(g, [100], 1, bucket=1, context=256)
    batch.block_tables["compressed"][0, 1] = -1  # entries of positions 16..31
    batch.block_tables["window"][0, 6] = -1  # positions 96..111: the token and its window
    with pytest.raises(RuntimeError, match="no 'window' block"):
        StepAddressing(batch, sliding_window=8, kinds=KINDS, context_bucket=256)
    dev = StepAddressing.static_on_device(batch, sliding_window=8, kinds=KINDS, context_bucket=256)
    assert dev.token_slots.tolist() == [-1]
    assert (dev.window_slots[0, -5:] == -1).all() and (dev.window_slots[0, :-5] >= 0).all()  # 96..100 gone
    cand = dev.compression(4, True).cand_slots[0]
    assert (cand[4:8] < 0).all() and (cand[:4] >= 0).all() and (cand[8:25] >= 0).all()
    for c in (dev.compression(r, o) for r, o in KINDS):
        assert (c.entry_slots >= -1).all() and (c.src_slots >= -1).all()
