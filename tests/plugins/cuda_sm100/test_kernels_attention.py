"""Attention kernels (sparse attention with sinks, indexer scoring + top-k, compressor) vs the reference. V4's FP8
KV cache: ``test_kernels_fp8_kv.py``; V4.1's packed entries: ``test_kernels_v41_packed.py``."""

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
