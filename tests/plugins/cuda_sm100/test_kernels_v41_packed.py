"""DeepSeek-V4.1's packed KV entries in the attention kernels (FP8 window entries, FP4 compressed entries and index
keys): the store writes the codec's bytes, the sparse attention and the indexer's scores decode them in the kernel
against the reference, and a prefill chunk unpacks each distinct entry once."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.reference import reference_op

from .cuda_sm100_helpers import BOUND, DEVICE, dev, needs_triton, rand, rel_err, slot_lists, spread_rows

pytestmark = needs_triton
REF = reference_op("attention")


@pytest.fixture(scope="module")
def ops():
    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps

    return CudaAttentionOps()


def _v41_formats(dtype, head_dim=64, index_head_dim=64):
    from deepinfer_core.models.deepseek_v41.kv_formats import kv_formats

    return kv_formats("auto", head_dim, index_head_dim, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [False, True], ids=["compressed", "dspark_block"])
def test_sparse_attention_reads_v41_packed_pools(ops, gen, dtype, block):
    """V4.1's trained cache (``packed_kv``): the FP8 window pool and the FP4 compressed pool (or, for a DSpark
    block, block rows packed in the window's format with no ``cmp_format``) read by the kernel through rows
    unpacked for the step, against the reference over the same packed pools, and equal to it over the
    unpacked values (the packed read adds nothing)."""
    f = _v41_formats(dtype)
    cmp_fmt = None if block else f.compressed
    T, H, D = 5, 12, 64
    q = rand(gen, T, H, D, dtype=dtype)
    kv = f.window.pack(rand(gen, 70, D, dtype=dtype, scale=2.0))
    cmp = (f.window if block else f.compressed).pack(rand(gen, 30, D, dtype=dtype, scale=2.0))
    kv_slots, cmp_slots = slot_lists(gen, T, 37, 70), slot_lists(gen, T, 19, 30)
    kv_slots[2] = -1
    sinks = rand(gen, H)
    got = ops.sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.1, kv_format=f.window,
                               cmp_format=cmp_fmt)  # fmt: skip
    ref = REF.sparse_attention(
        q, kv, kv_slots, cmp, cmp_slots, sinks, 0.1, kv_format=f.window, cmp_format=cmp_fmt
    )
    assert got.dtype == dtype
    assert rel_err(got, ref) < BOUND[dtype]
    unpacked_cmp = (f.window if block else f.compressed).unpack(cmp)
    plain = REF.sparse_attention(q, f.window.unpack(kv), kv_slots, unpacked_cmp, cmp_slots, sinks, 0.1)
    assert torch.equal(ref, plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_v41_packed_store_writes_the_reference_bytes(ops, gen, dtype):
    """Stores through V4.1's codecs write exactly the reference's bytes (window FP8, compressed and index-key FP4),
    slot -1 being the scratch row."""
    f = _v41_formats(dtype)
    for fmt in (f.window, f.compressed, f.keys):
        values = rand(gen, 9, 64, dtype=dtype, scale=3.0)
        slots = torch.tensor([4, 0, 7, -1, 2, 11, 5, 9, 1])
        pool = torch.zeros(13, fmt.row_bytes, dtype=torch.uint8)
        got = dev(pool.clone())
        ops.store_kv(got, *dev(slots, values), fmt)
        REF.store_kv(pool, slots, values, fmt)
        assert torch.equal(got.cpu(), pool)


@pytest.mark.parametrize("k", [4, 30])
def test_indexer_topk_reads_v41_fp4_keys(ops, gen, k):
    """``indexer_topk`` over V4.1's packed FP4 index keys (``key_format``): the same columns as the reference
    (as sets: any order), ``-1`` past a row's valid candidates, rows with none all ``-1``."""
    f = _v41_formats(torch.float32)
    T, H, D, S, C = 6, 8, 64, 40, 23
    q, w = rand(gen, T, H, D), rand(gen, T, H)
    pool = f.keys.pack(rand(gen, S, D))
    cand = slot_lists(gen, T, C, S)
    cand[1] = -1
    got = ops.indexer_topk(*dev(q, w, pool, cand), k, key_format=f.keys).cpu()
    ref = REF.indexer_topk(q, w, pool, cand, k, key_format=f.keys)
    assert got.shape == ref.shape
    for t in range(T):
        assert sorted(got[t].tolist()) == sorted(ref[t].tolist()), t
    assert (got[1] == -1).all()


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("block", [False, True], ids=["compressed", "dspark_block"])
def test_sparse_attention_decodes_v41_entries_in_the_kernel(ops, gen, monkeypatch, split, block):
    """The kernel reads V4.1's packed pools itself (no unpacked copy): the window's e4m3 + ue8m0/32 entries and
    the compressed e2m1 + e4m3/16 ones (a DSpark block: the window's format), with and without split-KV, equal to
    attention over the unpacked rows; index keys' e2m1 + ue8m0/32 rows decode to the codec's values too."""
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa
    from deepinfer_cuda_sm100.ops import attention as att

    unpacked = []
    real_unpacked = att._unpacked
    monkeypatch.setattr(att, "_unpacked", lambda *a: unpacked.append(1) or real_unpacked(*a))
    f = _v41_formats(torch.float32)
    cf = f.window if block else f.compressed
    T, H, D = 4, 12, 64
    q = rand(gen, T, H, D)
    kv, cmp = f.window.pack(rand(gen, 50, D, scale=2.0)), cf.pack(rand(gen, 30, D, scale=2.0))
    kv_slots, cmp_slots = slot_lists(gen, T, 21, 50), slot_lists(gen, T, 13, 30)
    sinks = rand(gen, H)
    want = REF.sparse_attention(q, f.window.unpack(kv), kv_slots, cf.unpack(cmp), cmp_slots, sinks, 0.1)
    got = sa.sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.1, splits=split,
                              kv_pack=sa.packed_layout(f.window, D), cmp_pack=sa.packed_layout(cf, D))  # fmt: skip
    assert rel_err(got, want) < BOUND[torch.float32]
    through_ops = ops.sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.1, kv_format=f.window,
                                       cmp_format=None if block else f.compressed)  # fmt: skip
    assert unpacked == [] and rel_err(through_ops, want) < BOUND[torch.float32]
    keys = f.keys.pack(rand(gen, 30, D, scale=2.0))
    got = sa.sparse_attention(*dev(q, kv, kv_slots, keys, cmp_slots, sinks), 0.1, splits=split,
                              kv_pack=sa.packed_layout(f.window, D), cmp_pack=sa.packed_layout(f.keys, D))  # fmt: skip
    want = REF.sparse_attention(q, f.window.unpack(kv), kv_slots, f.keys.unpack(keys), cmp_slots, sinks, 0.1)
    assert rel_err(got, want) < BOUND[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split", [1, 3])
def test_packed_tiles_decode_the_bytes_of_the_per_value_gather(gen, monkeypatch, dtype, split):
    """Entries of a power-of-two width are decoded a tile at a time (each code byte and each scale loaded once,
    ``_load_packed_tile``): the attention's output is the per-value gather's (``_load_packed``) byte for byte, for
    the window's e4m3 + ue8m0/32, the compressed e2m1 + e4m3/16 and the index keys' e2m1 + ue8m0/32 entries, with
    padding slots."""
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa

    f = _v41_formats(dtype)
    T, H, D = 3, 8, 64
    q = rand(gen, T, H, D, dtype=dtype)
    kv = f.window.pack(rand(gen, 40, D, dtype=dtype, scale=2.0))
    kv_slots = slot_lists(gen, T, 21, 40)
    kv_slots[1, 3:9] = -1
    sinks = rand(gen, H)
    for cf in (f.compressed, f.keys):
        cmp = cf.pack(rand(gen, 30, D, dtype=dtype, scale=2.0))
        cmp_slots = slot_lists(gen, T, 13, 30)
        args = dev(q, kv, kv_slots, cmp, cmp_slots, sinks)
        layouts = dict(kv_pack=sa.packed_layout(f.window, D), cmp_pack=sa.packed_layout(cf, D))
        outs = []
        for tiles in (True, False):
            monkeypatch.setattr(sa, "PACKED_TILES", tiles)
            outs.append(sa.sparse_attention(*args, 0.1, splits=split, **layouts))
        assert torch.equal(outs[0], outs[1]), cf.fmt.name
        want = REF.sparse_attention(q, f.window.unpack(kv), kv_slots, cf.unpack(cmp), cmp_slots, sinks, 0.1)
        assert rel_err(outs[0], want) < BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [False, True], ids=["compressed", "dspark_block"])
def test_a_prefill_chunk_unpacks_each_distinct_packed_entry_once(ops, gen, monkeypatch, dtype, block):
    """From ``dispatch.UNPACK_DISTINCT_ROWS`` query rows on (a prefill chunk; lowered here), the step unpacks
    each distinct entry its slots name once and runs the plain kernel: the rows unpacked are exactly the
    distinct slots' codec values (not one per read), and the attention equals the reference's over the packed
    pools within the dtype's bound."""
    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa
    from deepinfer_cuda_sm100.ops import attention as att

    monkeypatch.setattr(dispatch, "UNPACK_DISTINCT_ROWS", 4)
    calls, kernel_packs = [], []
    real_distinct, real_kernel = att._distinct_unpacked, sa.sparse_attention

    def distinct(pool, slots, fmt):
        rows, new = real_distinct(pool, slots, fmt)
        calls.append((fmt, rows, new))
        return rows, new

    def kernel(*a, **kw):
        kernel_packs.append((kw.get("kv_pack"), kw.get("cmp_pack"), a[1].dtype))
        return real_kernel(*a, **kw)

    monkeypatch.setattr(att, "_distinct_unpacked", distinct)
    monkeypatch.setattr(sa, "sparse_attention", kernel)
    f = _v41_formats(dtype)
    cf = f.window if block else f.compressed
    T, H, D = 9, 12, 64
    q = rand(gen, T, H, D, dtype=dtype)
    kv, cmp = (
        f.window.pack(rand(gen, 40, D, dtype=dtype, scale=2.0)),
        cf.pack(rand(gen, 25, D, dtype=dtype, scale=2.0)),
    )
    kv_slots, cmp_slots = slot_lists(gen, T, 16, 40), slot_lists(gen, T, 11, 25)  # many repeats across rows
    kv_slots[3] = -1
    kv_slots[kv_slots == 0], cmp_slots[cmp_slots == 0] = (
        1,
        1,
    )  # no live read of row 0: a pad must not unpack it
    sinks = rand(gen, H)
    got = ops.sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.1, kv_format=f.window,
                               cmp_format=None if block else f.compressed)  # fmt: skip
    ref = REF.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.1, kv_format=f.window,
                               cmp_format=None if block else f.compressed)  # fmt: skip
    assert rel_err(got, ref) < BOUND[dtype]
    assert kernel_packs == [(None, None, dtype)]  # the plain kernel over unpacked rows, no in-kernel decoding
    assert len(calls) == 2
    for (fmt, rows, new), packed, old in zip(calls, (kv, cmp), (kv_slots, cmp_slots), strict=True):
        live = old >= 0
        assert rows.shape[0] == len(set(old[live].tolist()))  # each distinct entry once, none for no entry
        assert torch.equal((new.cpu() >= 0), live)
        assert torch.equal(rows.cpu()[new.cpu()[live]], fmt.unpack(packed[old[live]]))


def test_other_packed_codecs_are_unpacked_for_the_kernel(ops, gen, monkeypatch):
    """A codec the kernel does not decode (here e4m3 codes with e4m3 scales) still attends correctly: the rows
    each token reads are unpacked into plain rows first."""
    from deepinfer_core.kv.packed import PackedFormat
    from deepinfer_core.models.deepseek_v41.kv_formats import PackedKV
    from deepinfer_cuda_sm100.ops import attention as att

    unpacked = []
    real_unpacked = att._unpacked
    monkeypatch.setattr(att, "_unpacked", lambda *a: unpacked.append(1) or real_unpacked(*a))
    fmt = PackedKV(PackedFormat("e4m3", "e4m3", 32, (64,)), torch.float32)
    T, H, D = 4, 12, 64
    q, sinks = rand(gen, T, H, D), rand(gen, H)
    kv, cmp = fmt.pack(rand(gen, 50, D)), fmt.pack(rand(gen, 30, D))
    kv_slots, cmp_slots = slot_lists(gen, T, 21, 50), slot_lists(gen, T, 13, 30)
    got = ops.sparse_attention(
        *dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.1, kv_format=fmt, cmp_format=fmt
    )
    want = REF.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.1, kv_format=fmt, cmp_format=fmt)
    assert unpacked == [1, 1] and rel_err(got, want) < BOUND[torch.float32]


@pytest.mark.parametrize("codec", ["v41_keys", "e2m1_e4m3"])
def test_fp4_index_keys_are_decoded_in_the_scoring_kernel(ops, gen, monkeypatch, codec):
    """V4.1's FP4 index keys (e2m1 + ue8m0/32) go through the Triton scoring kernel, decoded as gathered; a key
    codec it does not decode (e2m1 + e4m3/16) is unpacked in torch. Both equal the reference."""
    from deepinfer_core.kv.packed import PackedFormat
    from deepinfer_core.models.deepseek_v41.kv_formats import PackedKV
    from deepinfer_cuda_sm100.kernels import indexer

    launches = []
    real = indexer.indexer_scores
    monkeypatch.setattr(indexer, "indexer_scores", lambda *a, **k: launches.append(1) or real(*a, **k))
    D = 64
    fmt = (
        _v41_formats(torch.float32).keys
        if codec == "v41_keys"
        else PackedKV(PackedFormat("e2m1", "e4m3", 16, (D,)), torch.float32)
    )
    T, H, S, C = 5, 8, 40, 29
    q, w = rand(gen, T, H, D), rand(gen, T, H)
    pool = fmt.pack(rand(gen, S, D, scale=3.0))
    cand = slot_lists(gen, T, C, S)
    got = ops.indexer_scores(*dev(q, w, pool, cand), key_format=fmt).cpu()
    ref = REF.indexer_scores(q, w, pool, cand, key_format=fmt)
    assert launches == ([1] if codec == "v41_keys" else [])
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    finite = ~torch.isinf(ref)
    assert rel_err(got[finite], ref[finite]) < BOUND[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefill_chunk_scores_each_distinct_index_key_unpacked_once(ops, gen, monkeypatch, dtype):
    """From ``dispatch.UNPACK_DISTINCT_ROWS`` query rows on (lowered here), the indexer's scores unpack each
    distinct FP4 key its candidates name once and the kernel reads plain keys: the same scores, bit for bit, as
    the kernel decoding every read (the same tiles multiply the same values), and the reference's within the
    dtype's bound; the unpacked rows are exactly the distinct slots' codec values."""
    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import indexer
    from deepinfer_cuda_sm100.ops import attention as att

    fmt = _v41_formats(dtype).keys
    T, H, D, S, C = 9, 8, 64, 40, 29
    q, w = rand(gen, T, H, D, dtype=dtype), rand(gen, T, H)
    pool = fmt.pack(rand(gen, S, D, dtype=dtype, scale=3.0))
    cand = slot_lists(gen, T, C, S)  # many repeats across rows, and -1 pads
    cand[2] = -1
    cand[cand == 0] = 1  # no live read of row 0: a pad must not unpack it
    in_kernel = ops.indexer_scores(*dev(q, w, pool, cand), key_format=fmt).cpu()

    monkeypatch.setattr(dispatch, "UNPACK_DISTINCT_ROWS", 4)
    calls, key_packs = [], []
    real_distinct, real_scores = att._distinct_unpacked, indexer.indexer_scores

    def distinct(pool, slots, f):
        rows, new = real_distinct(pool, slots, f)
        calls.append((rows, new))
        return rows, new

    def scores(*a, key_format=None, **k):
        key_packs.append(key_format)
        return real_scores(*a, key_format=key_format, **k)

    monkeypatch.setattr(att, "_distinct_unpacked", distinct)
    monkeypatch.setattr(indexer, "indexer_scores", scores)
    got = ops.indexer_scores(*dev(q, w, pool, cand), key_format=fmt).cpu()
    assert key_packs == [None]  # the kernel read plain keys
    assert torch.equal(got, in_kernel)
    ref = REF.indexer_scores(q, w, pool, cand, key_format=fmt)
    assert torch.equal(torch.isinf(got), torch.isinf(ref)) and torch.isinf(got[2]).all()
    finite = ~torch.isinf(ref)
    assert rel_err(got[finite], ref[finite]) < BOUND[dtype]
    (rows, new), live = calls[0], cand >= 0
    assert rows.shape[0] == len(set(cand[live].tolist()))  # each distinct key once
    assert torch.equal(new.cpu() >= 0, live)
    assert torch.equal(rows.cpu()[new.cpu()[live]], fmt.unpack(pool[cand[live]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["window", "compressed", "keys"])
def test_kv_roundtrip_is_one_launch_bit_for_bit_the_codec(ops, gen, monkeypatch, dtype, which):
    """V4.1's index queries go through the index keys' FP4 format every step (``AttentionOps.kv_roundtrip``): one
    launch of ``_roundtrip_v41_kernel`` gives the codec's own pack-and-unpack values bit for bit, for each V4.1
    format, on rows with all-zero blocks, tiny negatives that round to -0.0, e2m1 midpoints and wide magnitudes."""
    from deepinfer_cuda_sm100.kernels import kv_store

    launches = []
    real = kv_store.roundtrip_v41
    monkeypatch.setattr(kv_store, "roundtrip_v41", lambda *a: launches.append(1) or real(*a))
    fmt = getattr(_v41_formats(dtype, 128, 128), which)
    x = rand(gen, 7, 128, scale=3.0)
    x[1] *= 1e-4
    x[2] = 0.0
    x[3] = -torch.rand(128, generator=gen) * 1e-7
    x[3, ::16] = 6.0  # each block's amax: the rest rounds to -0.0
    x[4, :32] = torch.tensor(
        [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4
    )  # e2m1 midpoints (amax 6: scale 1)
    x = x.to(dtype)
    got = ops.kv_roundtrip(x.to(DEVICE), fmt).cpu()
    want = fmt.roundtrip(x)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert launches == [1]
    assert int(torch.signbit(want[3]).sum()) > 100  # the -0.0 case is here
    assert torch.equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_v41_store_kernel_packs_edge_values_as_the_codec(ops, gen, monkeypatch, dtype):
    """One launch per store (``kv_store.store_v41``) writes the codec's bytes for every V4.1 format, on rows that
    reach its edge cases: all zeros (the amax floor), tiny negatives (codes of -0), e2m1 midpoints (ties to even),
    values at and beyond the block's amax, and a wide spread of magnitudes."""
    from deepinfer_cuda_sm100.kernels import kv_store

    launches = []
    real = kv_store.store_v41
    monkeypatch.setattr(kv_store, "store_v41", lambda *a: launches.append(a[3]) or real(*a))
    f = _v41_formats(dtype)
    rows = [torch.zeros(64), torch.full((64,), -1e-30), rand(gen, 64) * 1e-3, rand(gen, 64) * 1e3]
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 8)
    rows += [
        mids * torch.where(torch.arange(64) % 3 == 0, -1.0, 1.0),
        rand(gen, 64) * torch.logspace(-6, 4, 64),
    ]
    values = torch.stack(rows).to(dtype)
    slots = torch.tensor([3, 0, 5, -1, 1, 4])
    for fmt in (f.window, f.compressed, f.keys):
        pool = torch.zeros(7, fmt.row_bytes, dtype=torch.uint8)
        got = dev(pool.clone())
        ops.store_kv(got, *dev(slots, values), fmt)
        REF.store_kv(pool, slots, values, fmt)
        assert torch.equal(got.cpu(), pool), fmt.fmt.name
    assert launches == [f.window, f.compressed, f.keys]


def test_v41_packed_attention_with_every_head_in_one_program_matches_reference(ops, gen, monkeypatch):
    """The tile a GPU dispatches for V4.1's packed entries from two query rows on: all 64 heads of 512 channels a
    program, 32 slots a tile, one stage, split-KV into chunks and their combine, against the reference in float32
    over the unpacked entries."""
    from deepinfer_cuda_sm100 import dispatch

    from .test_kernels_fp8_kv import _as_on_sm90

    restore = _as_on_sm90(monkeypatch)
    try:
        T, H, D = 2, 64, 512
        assert dispatch.attention_config(T, H, D, 96, packed=True) == dispatch.AttentionConfig(64, 32, 8, 1)
        f = _v41_formats(torch.bfloat16, D, 128)
        q = rand(gen, T, H, D, dtype=torch.bfloat16)
        kv, cmp = f.window.pack(spread_rows(gen, 50, D)), f.compressed.pack(spread_rows(gen, 30, D))
        kv_slots, cmp_slots = slot_lists(gen, T, 64, 50), slot_lists(gen, T, 32, 30)
        sinks = rand(gen, H)
        args = (q, kv, kv_slots, cmp, cmp_slots, sinks)
        got = ops.sparse_attention(*dev(*args), 0.05, kv_format=f.window, cmp_format=f.compressed)
    finally:
        restore()
    ref = REF.sparse_attention(q.float(), f.window.unpack(kv).float(), kv_slots, f.compressed.unpack(cmp).float(),
                               cmp_slots, sinks, 0.05)  # fmt: skip
    assert rel_err(got, ref) < BOUND[torch.bfloat16]
