"""Reference ops are batch invariant: a row's result is bit-identical alone, inside any batch, and whatever
the other rows are (the engine relies on it: greedy tokens must not depend on batch size or chunking)."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.reference import ReferenceAttentionOps, ReferenceDenseOps, ReferenceMoEOps
from deepinfer_core.ops.weights import ExpertWeights

dense, attention, moe = ReferenceDenseOps(), ReferenceAttentionOps(), ReferenceMoEOps()
G = torch.Generator().manual_seed(0)


def rnd(*shape, scale=1.0):
    return torch.randn(shape, generator=G) * scale


def _assert_rows_invariant(fn, batch_inputs: tuple, rows=(0, 5, 36)):
    """``fn(*inputs)`` row ``i`` equals ``fn`` on row ``i`` alone, and on the first ``k`` rows only."""
    full = fn(*batch_inputs)
    full = full if isinstance(full, tuple) else (full,)
    for i in rows:
        alone = fn(*(x[i : i + 1] for x in batch_inputs))
        alone = alone if isinstance(alone, tuple) else (alone,)
        for a, f in zip(alone, full):
            assert torch.equal(a[0], f[i]), (
                f"row {i} differs alone vs in a batch of {batch_inputs[0].shape[0]}"
            )
    head = fn(*(x[:7] for x in batch_inputs))
    head = head if isinstance(head, tuple) else (head,)
    for h, f in zip(head, full):
        assert torch.equal(h, f[:7])


@pytest.mark.parametrize("quant", [None, "fp8", "fp4"])
def test_linear(quant):
    w = rnd(96, 128, scale=0.1)
    w = quantize_fp8_block(w) if quant == "fp8" else quantize_fp4_e2m1(w) if quant == "fp4" else w
    _assert_rows_invariant(lambda x: dense.linear(x, w), (rnd(40, 128),))


def test_norm_rope_and_swiglu():
    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
    _assert_rows_invariant(lambda x: dense.rms_norm(x, None, 1e-6), (rnd(40, 4, 64, scale=3),))
    _assert_rows_invariant(lambda x: dense.rms_norm(x, torch.ones(64) * 1.1, 1e-6), (rnd(40, 64),))
    _assert_rows_invariant(
        lambda x, p: dense.rope(x, p, inv, inverse=True),
        (rnd(40, 4, 64), torch.randint(0, 9999, (40,), generator=G)),
    )
    w1, w3, w2 = rnd(32, 64, scale=0.2), rnd(32, 64, scale=0.2), rnd(64, 32, scale=0.2)
    _assert_rows_invariant(lambda x: dense.swiglu_mlp(x, w1, w3, w2, 1.0), (rnd(40, 64),))


def test_mhc_ops():
    n, d = 4, 32
    fn, base, scale = rnd((2 + n) * n, n * d, scale=0.05), rnd((2 + n) * n), rnd(3) + 1
    hc, head = HCParams(fn, base, scale, 20, 1e-6, 1e-6), HCParams(fn[:n], base[:n], scale[:1], 0, 1e-6, 1e-6)
    _assert_rows_invariant(lambda x: dense.hc_pre(x, hc), (rnd(40, n, d),))
    comb = torch.softmax(rnd(40, n, n), -1)
    _assert_rows_invariant(
        lambda y, r, p, c: dense.hc_post(y, r, p, c), (rnd(40, d), rnd(40, n, d), rnd(40, n), comb)
    )
    _assert_rows_invariant(lambda x: dense.hc_head(x, head), (rnd(40, n, d),))
    _assert_rows_invariant(lambda x: dense.hc_mixes(x, hc), (rnd(40, n, d),))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_sinkhorn_gives_a_matrix_the_same_bits_in_any_batch(n):
    """The row-by-row mHC defaults run the Sinkhorn once over every row's ``comb`` (``ops.mhc.sinkhorn``): each
    matrix must come out as it does alone, at batch sizes on both sides of the vector widths; and ``hc_mixes``
    gives the row-by-row function's bits (``mix_coefficients`` on each row alone)."""
    from deepinfer_core.ops.mhc import mix_coefficients, sinkhorn

    for rows in (1, 2, 3, 5, 8, 9, 16, 17, 33, 100, 257):
        comb = torch.softmax(rnd(rows, n, n, scale=3.0), -1) + 1e-6
        alone = torch.cat([sinkhorn(comb[i : i + 1].clone(), 20, 1e-6) for i in range(rows)])
        assert torch.equal(sinkhorn(comb, 20, 1e-6), alone), rows
    d = 16
    hc = HCParams(rnd((2 + n) * n, n * d, scale=0.05), rnd((2 + n) * n), rnd(3) + 1, 20, 1e-6, 1e-6)
    x = rnd(33, n, d)
    want = [
        torch.cat(parts) for parts in zip(*(mix_coefficients(x[i : i + 1].clone(), hc) for i in range(33)))
    ]
    for got, w in zip(dense.hc_mixes(x, hc), want, strict=True):
        assert torch.equal(got, w)


def test_sparse_attention_row_does_not_depend_on_other_rows_or_padding():
    pool, cmp_pool, sinks = rnd(100, 32), rnd(30, 32), rnd(4)
    q = rnd(40, 4, 32)
    slots = torch.stack([torch.randperm(100, generator=G)[:16] for _ in range(40)])
    slots[::3, 10:] = -1
    cmp = torch.stack([torch.randperm(30, generator=G)[:6] for _ in range(40)])
    full = attention.sparse_attention(q, pool, slots, cmp_pool, cmp, sinks, 0.2)
    for i in (0, 3, 17):
        valid = slots[i][slots[i] >= 0]
        alone = attention.sparse_attention(
            q[i : i + 1], pool, valid[None], cmp_pool, cmp[i : i + 1], sinks, 0.2
        )
        assert torch.equal(alone[0], full[i])


def test_indexer_and_compress():
    cand = torch.stack([torch.randperm(50, generator=G)[:20] for _ in range(40)])
    _assert_rows_invariant(
        lambda q, w, c: attention.indexer_topk(q, w, rnd_keys, c, 6), (rnd(40, 8, 16), rnd(40, 8).abs(), cand)
    )
    inv = 1.0 / 160000 ** (torch.arange(0, 8, 2).float() / 8)
    norm = torch.ones(32)
    _assert_rows_invariant(
        lambda kv, s, p: attention.compress(kv, s, norm, 1e-6, p, inv),
        (rnd(40, 8, 32), rnd(40, 8, 32), torch.arange(40) * 4),
    )


rnd_keys = rnd(50, 16)


@pytest.mark.parametrize("quant", [None, "fp4"])
def test_moe_routing_and_experts(quant):
    bias = rnd(16, scale=0.2)
    _assert_rows_invariant(lambda lg: moe.route_topk(lg, bias, 4, "sqrtsoftplus", 1.5), (rnd(40, 16),))
    ids = torch.stack([torch.randperm(16, generator=G)[:4] for _ in range(40)])
    _assert_rows_invariant(lambda lg, i: moe.route_hash(lg, i, "sigmoid", 2.0), (rnd(40, 16), ids))

    def w(o, i):
        m = rnd(o, i, scale=0.2)
        return quantize_fp4_e2m1(m) if quant == "fp4" else m

    ex = ExpertWeights(
        [w(32, 64) for _ in range(16)],
        [w(32, 64) for _ in range(16)],
        [w(64, 32) for _ in range(16)],
        list(range(16)),
    )
    _assert_rows_invariant(
        lambda x, i, wt: moe.experts(x, i, wt, ex, 1.0), (rnd(40, 64), ids, torch.rand(40, 4, generator=G))
    )
