"""Conformance cases for the attention ops: sliding window + sinks, CSA (top-k compressed slots), HCA,
padding (``-1`` slots), a row with nothing to attend, the indexer's top-k, the compressor, and the vision
tower's bidirectional attention within packed images."""

from __future__ import annotations

import torch

from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
from deepinfer_core.testing.cases_dense import inv_freq, randn
from deepinfer_core.testing.opcase import OpCase

T, H, D = 6, 4, 32


def _slots(g: torch.Generator, rows: int, width: int, pool: int, min_valid: int = 0) -> torch.Tensor:
    """``[rows, width]`` distinct slots per row, a random number of them (>= ``min_valid``) valid, rest -1."""
    out = torch.full((rows, width), -1, dtype=torch.int64)
    for r in range(rows):
        n = int(torch.randint(min_valid, width + 1, (1,), generator=g))
        out[r, :n] = torch.randperm(pool, generator=g)[:n]
    return out


def _sparse(compressed: bool, empty_row: bool):
    def make(g):
        kv_slots = _slots(g, T, 8, 40, min_valid=1)
        if empty_row:
            kv_slots[2] = -1
        cmp_pool = randn(g, 24, D) if compressed else None
        cmp_slots = _slots(g, T, 5, 24) if compressed else None
        if compressed and empty_row:
            cmp_slots[2] = -1
        return (randn(g, T, H, D), randn(g, 40, D), kv_slots, cmp_pool, cmp_slots, randn(g, H), D**-0.5), {}

    return make


def _sparse_fp8(g):
    """Both pools packed (``head_dim`` 32, RoPE 8, a short last scale group), values spread over 2**12 so
    the per-group scales differ; the reference reads them through ``Fp8KVFormat.unpack``."""
    fmt = Fp8KVFormat(D, 8, torch.float32)
    args, _ = _sparse(True, True)(g)
    q, kv, kv_slots, cmp, cmp_slots, sinks, scale = args
    spread = 2.0 ** torch.randint(-6, 6, (1, D), generator=g).float()
    return (q, fmt.pack(kv * spread), kv_slots, fmt.pack(cmp * spread), cmp_slots, sinks, scale), {
        "kv_format": fmt
    }


def _indexer(g):
    cand = _slots(g, T, 12, 30)
    cand[0, :3] = torch.tensor([4, 9, 17])
    cand[0, 3:] = -1  # fewer valid candidates than topk
    return (randn(g, T, 8, 16), randn(g, T, 8).abs(), randn(g, 30, 16), cand, 5), {}


def _indexer_packed(g):
    """:func:`_indexer`'s rows over V4.1's FP4 index keys (e2m1 codes, ue8m0 scales per 32), read as packed
    bytes through their format."""
    from deepinfer_core.kv.packed import PackedFormat
    from deepinfer_core.models.deepseek_v41.kv_formats import PackedKV

    fmt = PackedKV(PackedFormat("e2m1", "ue8m0", 32, (64,)), torch.float32)
    cand = _slots(g, T, 12, 30)
    cand[1, 2:] = -1
    keys = fmt.pack(randn(g, 30, 64))
    return (randn(g, T, 4, 64), randn(g, T, 4).abs(), keys, cand, 5), {"key_format": fmt}


def _needs_packed_kv(backends) -> str | None:
    if getattr(backends.attention, "packed_kv", False):
        return None
    return "the platform does not read V4.1's packed KV formats (AttentionOps.packed_kv is False)"


def _indexer_scores(g):
    args, _ = _indexer(g)
    return args[:4], {}


def _candidate_blocks(g):
    """Blocks of 4 over 14 entries: a row seeing none, a row whose scores tie, a row where an old block
    outscores the newest one (which is pinned anyway), and rows with fewer blocks than the pool holds."""
    visible = torch.tensor([0, 3, 14, 14, 9, 6])
    scores = randn(g, 6, 14)
    scores[3, :] = 0.5
    scores[2, :4] = 9.0
    cols = torch.arange(14)[None, :]
    scores = scores.masked_fill(cols >= visible[:, None], float("-inf"))
    return (scores, visible, 2, 4), {}


def _same_topk(actual: torch.Tensor, expected: torch.Tensor, inputs) -> None:
    """Top-k is a set: compare each row's chosen columns, order-free; padding (-1) must match in count."""
    assert actual.shape == expected.shape, f"top-k: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    for r in range(expected.shape[0]):
        a, e = sorted(actual[r].tolist()), sorted(expected[r].tolist())
        assert a == e, f"top-k row {r}: {a} != {e}"


def _encoder(g):
    """Three packed images of 1, 5 and 3 patches: each row attends to its own image only."""
    q, k, v = (randn(g, 9, H, 16) for _ in range(3))
    return (q, k, v, torch.tensor([0, 1, 6, 9]), 16**-0.5), {}


def _compress(overlap: bool):
    def make(g):
        e, r = 3, 4
        length = 2 * r if overlap else r
        score = randn(g, e, length, D)
        if overlap:
            score[0, :r] = float("-inf")  # the first window's Ca half is empty
        positions = torch.tensor([0, 4, 40]) if overlap else torch.tensor([0, 16, 128])
        return (
            randn(g, e, length, D),
            score,
            randn(g, D).abs() + 0.5,
            1e-6,
            positions,
            inv_freq(8, 160000.0),
        ), {}

    return make


def _roundtrip(values: str, scales: str, block: int):
    """Rows of several magnitudes with the rounding rule's edge cases (tiny negatives that round to -0.0, zero
    rows), through a V4.1 codec (``kv_roundtrip``: values as the pool returns them after a store)."""

    def make(g: torch.Generator) -> tuple[tuple, dict]:
        from deepinfer_core.kv.packed import PackedFormat
        from deepinfer_core.models.deepseek_v41.kv_formats import PackedKV

        x = randn(g, 6, 64) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 1.0, 1.0])[:, None]
        x[3] = -torch.rand(64, generator=g) * 1e-7  # round to -0.0 beside a large value
        x[3, ::block] = 5.0
        x[4] = 0.0
        return (x, PackedKV(PackedFormat(values, scales, block, (64,)), torch.float32)), {}

    return make


def _exact(case_id: str):
    def compare(actual, expected, inputs) -> None:
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, f"{case_id}: dtype or shape"
        assert torch.equal(actual.view(torch.int32), expected.view(torch.int32)), (
            f"{case_id}: not bit for bit the codec's round trip (signed zeros included)"
        )

    return compare


CASES = [
    OpCase(
        "attention", "sparse_attention", "sliding_window_sinks", _sparse(False, False), atol=1e-5, rtol=1e-4
    ),
    OpCase(
        "attention", "sparse_attention", "window_plus_compressed", _sparse(True, False), atol=1e-5, rtol=1e-4
    ),
    OpCase("attention", "sparse_attention", "row_without_slots", _sparse(True, True), atol=1e-5, rtol=1e-4),
    OpCase(
        "attention",
        "sparse_attention",
        "fp8_kv_cache",
        _sparse_fp8,
        atol=1e-5,
        rtol=1e-4,
        kv_cache_dtype="fp8",
    ),
    OpCase("attention", "indexer_topk", "topk_with_short_rows", _indexer, compare=_same_topk),
    OpCase("attention", "indexer_topk_slots", "topk_with_short_rows", _indexer, compare=_same_topk),
    OpCase(
        "attention",
        "indexer_topk_slots",
        "v41_fp4_keys",
        _indexer_packed,
        compare=_same_topk,
        requires=_needs_packed_kv,
    ),
    OpCase("attention", "encoder_attention", "three_images", _encoder, atol=1e-5, rtol=1e-4),
    OpCase("attention", "indexer_scores", "short_rows", _indexer_scores, atol=1e-5, rtol=1e-4),
    OpCase("attention", "candidate_blocks", "pinned_tied_and_empty_rows", _candidate_blocks),
    OpCase("attention", "compress", "csa_overlap_first_window", _compress(True), atol=1e-5, rtol=1e-4),
    OpCase("attention", "compress", "hca", _compress(False), atol=1e-5, rtol=1e-4),
    *(
        OpCase(
            "attention",
            "kv_roundtrip",
            name,
            _roundtrip(*fmt),
            compare=_exact(f"attention.kv_roundtrip[{name}]"),
        )
        for name, fmt in (
            ("v41_window_e4m3", ("e4m3", "ue8m0", 32)),
            ("v41_compressed_e2m1", ("e2m1", "e4m3", 16)),
            ("v41_index_keys_e2m1", ("e2m1", "ue8m0", 32)),
        )
    ),
]
