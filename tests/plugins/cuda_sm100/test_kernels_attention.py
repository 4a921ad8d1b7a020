"""Attention kernels (sparse attention with sinks, indexer scoring + top-k, compressor) vs the reference. V4's FP8
KV cache: ``test_kernels_fp8_kv.py``."""

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_cmp", [True, False])
def test_sparse_attention_matches_reference(ops, gen, dtype, with_cmp):
    T, H, D = 5, 20, 48  # 20 heads: a partial head block; D=48: a partial channel tile
    q = rand(gen, T, H, D, dtype=dtype)
    kv = rand(gen, 70, D, dtype=dtype)
    kv_slots = slot_lists(gen, T, 37, 70)
    kv_slots[2] = -1  # a row whose window is all padding still sees the compressed slots
    cmp = rand(gen, 30, D, dtype=dtype) if with_cmp else None
    cmp_slots = slot_lists(gen, T, 19, 30) if with_cmp else None
    sinks = rand(gen, H)
    got = ops.sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.2)
    ref = REF.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.2)
    assert got.dtype == dtype
    assert rel_err(got, ref) < BOUND[dtype]


@pytest.mark.parametrize("splits", [2, 3, 8])
@pytest.mark.parametrize("fp8", [False, True, "gather"])
def test_split_kv_attention_matches_reference(gen, splits, fp8):
    """Split-KV decode (chunks of the window + compressed lists, then a combine): the same attention as the
    reference, for chunks that straddle the two lists (37 window slots), a row with no valid slot at all
    (only the sink: zeros) and a chunk whose slots are all padding. ``gather``: FP8 scales gathered per channel."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.kernels.sparse_attention import sparse_attention

    settings.use(settings.CudaSM100Settings(fp8_kv_scale_gather=fp8 == "gather"))
    T, H, D = 3, 20, 80
    fmt = Fp8KVFormat(D, 16, torch.float32) if fp8 else None
    q = rand(gen, T, H, D)
    kv, cmp = spread_rows(gen, 70, D), spread_rows(gen, 30, D)
    if fmt is not None:
        kv, cmp = fmt.pack(kv), fmt.pack(cmp)
    kv_slots, cmp_slots = slot_lists(gen, T, 37, 70), slot_lists(gen, T, 19, 30)
    kv_slots[1], cmp_slots[1] = -1, -1
    kv_slots[2, :20] = -1
    sinks = rand(gen, H)
    got = sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.05, fmt, splits=splits).cpu()
    ref = REF.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.05, fmt)
    one = sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.05, fmt, splits=1).cpu()
    assert rel_err(got, ref) < BOUND[torch.float32]
    assert rel_err(got, one) < BOUND[torch.float32]
    assert torch.equal(got[1], torch.zeros(H, D))


def test_split_kv_combine_over_several_blocks_of_chunks(gen):
    """More chunks than the combine reads at once (``BLOCK_S`` = 16 for 512-wide rows): the states merge across
    its steps as the reference's softmax, with some chunks all padding."""
    from deepinfer_cuda_sm100.kernels.sparse_attention import sparse_attention

    T, H, D, splits = 2, 3, 264, 37
    q = rand(gen, T, H, D)
    kv, cmp = spread_rows(gen, 700, D), spread_rows(gen, 90, D)
    kv_slots, cmp_slots = slot_lists(gen, T, 520, 700), slot_lists(gen, T, 70, 90)
    kv_slots[1, 100:300] = -1
    sinks = rand(gen, H)
    got = sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.05, splits=splits).cpu()
    ref = REF.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.05)
    assert rel_err(got, ref) < BOUND[torch.float32]


def test_sparse_attention_row_without_slots_is_zero(ops, gen):
    q = rand(gen, 3, 4, 16)
    kv = rand(gen, 10, 16)
    slots = slot_lists(gen, 3, 8, 10, pad_frac=0.0)
    slots[1] = -1
    got = ops.sparse_attention(*dev(q, kv, slots, None, None, rand(gen, 4)), 0.25)
    assert torch.equal(got[1].cpu(), torch.zeros(4, 16))
    assert got[0].abs().sum() > 0


def test_sink_takes_probability_mass(ops, gen):
    """A huge sink leaves almost no mass for the values; a very negative one changes nothing."""
    q, kv = rand(gen, 2, 4, 16), rand(gen, 10, 16)
    slots = slot_lists(gen, 2, 6, 10, pad_frac=0.0)
    big = ops.sparse_attention(*dev(q, kv, slots, None, None, torch.full((4,), 60.0)), 0.25)
    assert big.abs().max() < 1e-6
    none = ops.sparse_attention(*dev(q, kv, slots, None, None, torch.full((4,), -1e4)), 0.25)
    plain = torch.softmax(torch.einsum("thd,tkd->thk", q, kv[slots]) * 0.25, -1)
    assert rel_err(none, torch.einsum("thk,tkd->thd", plain, kv[slots])) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_indexer_topk_selects_the_best_scores(ops, gen, dtype):
    T, Hi, Di, C, S = 4, 8, 32, 90, 120
    q = rand(gen, T, Hi, Di, dtype=dtype)
    w = rand(gen, T, Hi).abs()
    keys = rand(gen, S, Di, dtype=dtype)
    cand = slot_lists(gen, T, C, S, pad_frac=0.2)
    cand[3, 5:] = -1  # fewer valid candidates than topk: the rest must be -1
    got = ops.indexer_topk(*dev(q, w, keys, cand), 16).cpu()
    ref = REF.indexer_topk(q, w, keys, cand, 16)
    assert got.shape == ref.shape == (T, 16)
    # compare the selected *scores* (ties may pick different columns)
    full = torch.relu(torch.einsum("thd,tcd->thc", q.double(), keys.double()[cand.clamp(min=0)]))
    score = (full * w.double()[..., None]).sum(1).masked_fill(cand < 0, float("-inf"))
    for t in range(T):
        g, r = got[t][got[t] >= 0], ref[t][ref[t] >= 0]
        assert g.numel() == r.numel() and len(set(g.tolist())) == g.numel()
        assert (cand[t, g] >= 0).all()
        torch.testing.assert_close(score[t, g].sort().values, score[t, r].sort().values, rtol=2e-2, atol=1e-3)
    assert (got[3] == -1).sum() == 16 - (cand[3] >= 0).sum()


@pytest.mark.parametrize("select", ["kernel", "torch"])
def test_indexer_select_returns_the_slots_of_indexer_topk(ops, gen, monkeypatch, select):
    """bf16 weights scaled in the scoring kernel, slots looked up in the select kernel (or after torch.topk):
    the same slots, in the same order, as ``indexer_topk`` on the weights scaled in torch, mapped in torch."""
    from deepinfer_cuda_sm100 import dispatch

    monkeypatch.setattr(dispatch, "indexer_select", lambda c: select)
    T, Hi, Di, C, S = 4, 8, 32, 90, 120
    q, keys = rand(gen, T, Hi, Di, dtype=torch.bfloat16), rand(gen, S, Di, dtype=torch.bfloat16)
    w = rand(gen, T, Hi, dtype=torch.bfloat16)  # signed: the scale and the relu both matter
    cand = slot_lists(gen, T, C, S, pad_frac=0.2)
    cand[3, 5:] = -1
    q, w, keys, cand = dev(q, w, keys, cand)
    got = ops.indexer_select(q, w, 0.0625, keys, cand, 16)
    cols = ops.indexer_topk(q, w.float() * 0.0625, keys, cand, 16)
    assert torch.equal(got, torch.where(cols >= 0, cand.gather(1, cols.clamp(min=0)), -1))
    assert (got[3] == -1).sum() == 16 - (cand[3] >= 0).sum() and (got[got >= 0] < S).all()


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("select", ["kernel", "torch"])
def test_indexer_topk_slots_are_the_slots_of_indexer_topk_in_order(ops, gen, monkeypatch, select, packed):
    """``indexer_topk_slots`` (columns mapped to slots in the select kernel, or beside ``torch.topk``): bit for
    bit ``indexer_topk``'s columns looked up in torch, the core's default, over plain keys and V4.1's FP4 index
    keys."""
    from deepinfer_core.kv.packed import PackedFormat
    from deepinfer_core.models.deepseek_v41.kv_formats import PackedKV
    from deepinfer_cuda_sm100 import dispatch

    monkeypatch.setattr(dispatch, "indexer_select", lambda c: select)
    T, Hi, Di, C, S = 4, 8, 64, 90, 120
    q, keys = rand(gen, T, Hi, Di), rand(gen, S, Di)
    fmt = PackedKV(PackedFormat("e2m1", "ue8m0", 32, (Di,)), torch.float32) if packed else None
    keys = fmt.pack(keys) if packed else keys
    w = rand(gen, T, Hi).abs()
    cand = slot_lists(gen, T, C, S, pad_frac=0.2)
    cand[3, 5:] = -1
    q, w, keys, cand = dev(q, w, keys, cand)
    got = ops.indexer_topk_slots(q, w, keys, cand, 16, key_format=fmt)
    cols = ops.indexer_topk(q, w, keys, cand, 16, key_format=fmt)
    assert torch.equal(got, torch.where(cols >= 0, cand.gather(1, cols.clamp(min=0)), -1))
    assert (got[3] == -1).sum() == 16 - (cand[3] >= 0).sum() and (got[got >= 0] < S).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compress_matches_reference(ops, gen, dtype):
    E, L, D = 6, 8, 40
    kv = rand(gen, E, L, D, dtype=dtype)
    score = rand(gen, E, L, D)
    score[1, 5:] = float("-inf")  # a window with empty slots
    w = rand(gen, D)
    pos = torch.randint(0, 1 << 16, (E,), generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    got = ops.compress(*dev(kv, score.to(dtype), w), 1e-6, *dev(pos, inv_freq))
    ref = REF.compress(kv, score.to(dtype), w, 1e-6, pos, inv_freq)
    assert got.dtype == dtype
    assert rel_err(got, ref) < BOUND[dtype]


@pytest.mark.parametrize("radix", [False, True], ids=["bisection", "radix"])
@pytest.mark.parametrize("C,k", [(300, 64), (37, 16), (1000, 512)])
def test_topk_select_kernel_picks_what_torch_topk_picks(gen, C, k, radix):
    """The select kernel's threshold by bisection or by digit histograms (``settings.radix_select``): the same
    scores as ``torch.topk`` (at ties, any columns), with heavy ties, fewer valid than ``k``, none valid, scores
    that share their top digits (``1 + tiny``) and signed zeros."""
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.kernels.indexer import select_topk

    T = 7
    s = torch.randn(T, C, generator=gen) * 3  # negative and positive scores
    s[1] = torch.randint(-3, 3, (C,), generator=gen).float()  # heavy ties at the threshold
    s[2, C // 3 :] = float("-inf")  # fewer valid than k for the smaller k
    s[3] = float("-inf")  # nothing valid
    s[4, ::2] = float("-inf")
    s[5] = (
        1.0 + torch.randint(0, 1 << 12, (C,), generator=gen).float() * 2**-23
    )  # keys differ in low digits only
    s[6, : C // 2], s[6, C // 2 :] = 0.0, -0.0
    active = settings.active()
    settings.use(settings.CudaSM100Settings(radix_select=radix))
    try:
        got = select_topk(dev(s), min(k, C)).cpu()
    finally:
        settings.use(active)
    val, idx = torch.topk(s, min(k, C), dim=1)
    for t in range(T):
        ref = idx[t][val[t] > float("-inf")]
        g = got[t][got[t] >= 0]
        assert g.numel() == ref.numel() and len(set(g.tolist())) == g.numel(), t
        assert (got[t][g.numel() :] == -1).all()  # chosen columns first, then -1
        # the same scores (at ties, any columns)
        assert torch.equal(s[t, g].sort().values, s[t, ref].sort().values), t


@pytest.mark.parametrize("pool_dtype,dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                              (torch.bfloat16, torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("d", [512, 80, 24])
def test_plain_kv_store_matches_the_reference(ops, gen, pool_dtype, dtype, d):
    """The CUDA op's one-launch store into a plain pool: the base class's ``pool[slots] = values.to(dtype)``,
    slot ``-1`` (the scratch slot) included, other rows untouched; values as a row-strided view."""
    values = rand(gen, 7, d + 8).to(dtype)[:, 4 : 4 + d]
    slots = torch.tensor([3, 17, 0, -1, 9, 12, 5])
    start = rand(gen, 20, d).to(pool_dtype)
    pool, want = start.clone().to(DEVICE), start.clone()
    ops.store_kv(pool, *dev(slots, values), None)
    reference_op("attention").store_kv(want, slots, values, None)
    if (
        dtype != pool_dtype and DEVICE.type == "cpu"
    ):  # the interpreter casts to bf16 by truncation, not rounding
        assert torch.allclose(pool.float(), want.float(), rtol=2**-7, atol=0)
        assert torch.equal(
            pool[[1, 2, 4, 6, 7, 8]], want[[1, 2, 4, 6, 7, 8]]
        )  # rows no slot names: untouched
    else:
        assert torch.equal(pool.cpu(), want)


# ------------------------------------------------------------------ compressor from the state pool


def _state_case(gen, overlap, D=48, ratio=4, S=40, E=5, dtype=torch.float32):
    C = 2 * D if overlap else D
    L = 2 * ratio if overlap else ratio
    state = rand(gen, S, 2, C)
    src = torch.randint(0, S, (E, L), generator=gen)
    src[1, : ratio if overlap else 1] = -1  # CSA's first window: an empty Ca half (or one empty row)
    src[3] = -1  # a static-mode row that closes nothing: no source at all
    pos = torch.randint(0, 5000, (E,), generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    w = rand(gen, D).abs() + 0.5
    return state, src, w, pos, inv_freq


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("fp8", [False, True])
def test_compress_into_matches_the_reference_glue(ops, gen, dtype, overlap, fp8):
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat

    state, src, w, pos, inv_freq = _state_case(gen, overlap)
    fmt = Fp8KVFormat(48, 16, dtype) if fp8 else None
    old = rand(gen, 12, 48)  # rows already in the pool: written rows must change, the others not
    entries = fmt.pack(old) if fp8 else old.to(dtype)
    # the window with no source goes to the scratch slot (-1: the last, 11), which no other window writes: the
    # programs run in any order on a GPU
    slots = torch.tensor([7, 0, 10, -1, 5])
    ref = entries.clone()
    REF.compress_into(state, src, overlap, w, 1e-6, pos, inv_freq, ref, slots, fmt)
    got = dev(entries.clone())
    ops.compress_into(*dev(state, src), overlap, dev(w), 1e-6, *dev(pos, inv_freq), got, dev(slots), fmt)
    got = got.cpu()
    if fp8:
        got, ref = fmt.unpack(got), fmt.unpack(ref)
    assert torch.equal(got[11], torch.zeros(48, dtype=got.dtype))  # no source: zeros, in the last slot
    assert torch.equal(got[[1, 2, 3, 4, 6, 8, 9]], ref[[1, 2, 3, 4, 6, 8, 9]])  # untouched rows
    assert rel_err(got, ref) < (BOUND[dtype] if not fp8 else 0.07)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("splits", [2, 3, 16])
def test_compress_in_chunks_matches_one_program(gen, overlap, splits):
    """Long windows summed in chunks by separate programs, then merged: the reference's rows, including the
    window with no source (zeros) and the one with an empty first half; the chunk sums are an online
    softmax, so equal to one program's up to rounding."""
    from deepinfer_cuda_sm100.kernels.compressor import compress_from_state

    state, src, w, pos, inv_freq = _state_case(gen, overlap, ratio=16)
    D = state.shape[-1] // (2 if overlap else 1)
    ref = torch.zeros(src.shape[0], D)
    REF.compress_into(state, src, overlap, w, 1e-6, pos, inv_freq, ref, torch.arange(src.shape[0]), None)
    got, one = dev(torch.zeros_like(ref)), dev(torch.zeros_like(ref))
    compress_from_state(*dev(state, src), overlap, dev(w), 1e-6, *dev(pos, inv_freq), got, None, splits)
    compress_from_state(*dev(state, src), overlap, dev(w), 1e-6, *dev(pos, inv_freq), one, None, 1)
    assert rel_err(got.cpu(), ref) < BOUND[torch.float32]
    assert rel_err(got.cpu(), one.cpu()) < 1e-5
    assert torch.equal(got[3].cpu(), torch.zeros(D))


def test_write_compressor_state_matches_the_reference(ops, gen):
    state = rand(gen, 20, 2, 24)
    kv, gate = rand(gen, 6, 24, dtype=torch.bfloat16), rand(gen, 6, 24, dtype=torch.bfloat16)
    ape, pos, slots = rand(gen, 4, 24), torch.tensor([0, 5, 6, 7, 130, 3]), torch.tensor([9, 2, 17, 0, 4, -1])
    ref = state.clone()
    REF.write_compressor_state(ref, slots, kv, gate, ape, pos)
    got = dev(state.clone())
    ops.write_compressor_state(got, *dev(slots, kv, gate, ape, pos))
    assert torch.equal(got.cpu(), ref)


@pytest.mark.parametrize("rows,width,block,k", [(7, 14, 4, 2), (33, 64, 8, 3), (5, 9, 4, 8), (1, 1, 4, 2)])
def test_candidate_blocks_equal_the_reference_for_all_rows_at_once(ops, gen, rows, width, block, k):
    """V4.1's candidate pool without a host sync per row (graph capture): the reference's choice on random
    scores, each row seeing a random number of entries (none for some), ``k`` above the block count too."""
    visible = torch.randint(0, width + 1, (rows,), generator=gen)
    visible[0] = 0
    scores = rand(gen, rows, width)
    scores = scores.masked_fill(torch.arange(width)[None, :] >= visible[:, None], float("-inf"))
    got = ops.candidate_blocks(*dev(scores, visible), k, block)
    assert torch.equal(got.cpu(), REF.candidate_blocks(scores, visible, k, block))


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "fp4_keys"])
def test_indexer_scores_equal_the_reference_without_a_host_sync(ops, gen, packed):
    """V4.1's candidate-source scores for all rows at once (the default finds each row's valid candidates
    on the host): plain keys through the Triton kernel, V4.1's packed FP4 index keys unpacked in torch."""
    from deepinfer_core.models.deepseek_v41.kv_formats import kv_formats

    T, H, D, S, C = 6, 8, 64, 40, 23
    fmt = kv_formats("auto", 128, D, torch.float32).keys if packed else None
    q, w = rand(gen, T, H, D), rand(gen, T, H).abs()
    keys = rand(gen, S, D)
    pool = fmt.pack(keys) if packed else keys
    cand = slot_lists(gen, T, C, S)
    cand[1] = -1  # a row without candidates
    got = ops.indexer_scores(*dev(q, w, pool, cand), key_format=fmt)
    ref = REF.indexer_scores(q, w, pool, cand, key_format=fmt)
    assert torch.equal(torch.isinf(got.cpu()), torch.isinf(ref))
    finite = ~torch.isinf(ref)
    assert rel_err(got.cpu()[finite], ref[finite]) < BOUND[torch.float32]


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_cmp", [True, False])
def test_a_prefill_chunk_unpacks_each_distinct_v4_fp8_entry_once(ops, gen, monkeypatch, dtype, with_cmp):
    """V4's FP8 pools take the same route as V4.1's codecs in a prefill chunk (from
    ``dispatch.UNPACK_DISTINCT_ROWS`` rows; lowered here): each distinct entry unpacked once into the model dtype,
    then the plain kernel (no in-kernel decoding); the attention equals the reference's over the FP8 pools. Below
    the threshold (a decode step) the kernel still decodes in registers."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa
    from deepinfer_cuda_sm100.ops import attention as att

    calls, formats = [], []
    real_distinct, real_kernel = att._distinct_unpacked, sa.sparse_attention

    def distinct(pool, slots, fmt):
        rows, new = real_distinct(pool, slots, fmt)
        calls.append((rows, new))
        return rows, new

    def kernel(*a, **kw):
        formats.append((a[7] if len(a) > 7 else kw.get("kv_format"), a[1].dtype))
        return real_kernel(*a, **kw)

    monkeypatch.setattr(att, "_distinct_unpacked", distinct)
    monkeypatch.setattr(sa, "sparse_attention", kernel)
    T, H, D = 9, 20, 80  # nope 64 + RoPE 16
    fmt = Fp8KVFormat(D, 16, dtype)
    q = rand(gen, T, H, D, dtype=dtype)
    kv, cmp = fmt.pack(spread_rows(gen, 40, D)), fmt.pack(spread_rows(gen, 25, D))
    kv_slots, cmp_slots = slot_lists(gen, T, 16, 40), slot_lists(gen, T, 11, 25)  # many repeats across rows
    kv_slots[kv_slots == 0] = 1  # no live read of row 0: a pad must not unpack it
    cmp_slots[cmp_slots == 0] = 1
    kv_slots[3] = -1
    sinks = rand(gen, H)
    cmp_args = (cmp, cmp_slots) if with_cmp else (None, None)
    ref = REF.sparse_attention(q, kv, kv_slots, *cmp_args, sinks, 0.05, fmt)
    for threshold, route in ((T + 1, [(fmt, torch.uint8)]), (4, [(None, dtype)])):
        monkeypatch.setattr(dispatch, "UNPACK_DISTINCT_ROWS", threshold)
        calls.clear(), formats.clear()
        got = ops.sparse_attention(*dev(q, kv, kv_slots, *cmp_args, sinks), 0.05, fmt)
        assert formats == route  # in-kernel decoding below the threshold, the plain kernel from it on
        assert rel_err(got, ref) < BOUND[dtype]
    assert len(calls) == (2 if with_cmp else 1)
    for (rows, new), packed, old in zip(calls, (kv, cmp), (kv_slots, cmp_slots)):
        live = old >= 0
        assert rows.dtype == dtype and rows.shape[0] == len(set(old[live].tolist()))  # each entry once
        assert torch.equal(new.cpu() >= 0, live)
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
