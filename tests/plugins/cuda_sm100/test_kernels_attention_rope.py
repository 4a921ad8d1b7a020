"""The attention step's rotations inside the sparse-attention kernels: the output rotated back
(``sparse_attention_unrope``) and the query rotated, optionally normed first, as the kernel loads it
(``rope_sparse_attention_unrope``), against the separate launches and the core's compositions on the reference."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.reference import reference_op

from .cuda_sm100_helpers import BOUND, Counting, dev, needs_triton, rand, rel_err, slot_lists
from .test_kernels_v41_packed import REF, _v41_formats

pytestmark = needs_triton


@pytest.fixture(scope="module")
def ops():
    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps

    return CudaAttentionOps()


def _inputs(gen, pool, dtype):
    """One attention step's inputs over plain, V4 FP8 or V4.1 packed pools (4 tokens, 12 heads of 64, RoPE on
    the last 16 channels at random positions): the host tensors, their device copies (``args``: ``q`` to
    ``sinks``; ``p``, ``fr``), the formats as the ops take them (``fmt``) and as the kernel does (``pack``,
    ``kernel_fmt``)."""
    from types import SimpleNamespace

    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa

    T, H, D, R = 4, 12, 64, 16
    q = rand(gen, T, H, D, dtype=dtype)
    kv, cmp = rand(gen, 50, D, dtype=dtype, scale=2.0), rand(gen, 30, D, dtype=dtype, scale=2.0)
    fmt, pack = {}, {}
    if pool == "v4_fp8":
        f = Fp8KVFormat(D, R, dtype)
        kv, cmp, fmt = f.pack(kv), f.pack(cmp), {"kv_format": f}
    elif pool == "v41_packed":
        f = _v41_formats(dtype)
        kv, cmp = f.window.pack(kv), f.compressed.pack(cmp)
        fmt = {"kv_format": f.window, "cmp_format": f.compressed}
        pack = {"kv_pack": sa.packed_layout(f.window, D), "cmp_pack": sa.packed_layout(f.compressed, D)}
    host = (q, kv, slot_lists(gen, T, 21, 50), cmp, slot_lists(gen, T, 13, 30), rand(gen, H))
    pos = torch.randint(0, 70000, (T,), generator=gen)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, R, 2).float() / R)
    p, fr = dev(pos, inv_freq)
    kernel_fmt = fmt.get("kv_format") if pool == "v4_fp8" else None
    return SimpleNamespace(
        host=host,
        pos=pos,
        inv_freq=inv_freq,
        args=dev(*host),
        p=p,
        fr=fr,
        fmt=fmt,
        pack=pack,
        kernel_fmt=kernel_fmt,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("pool", ["plain", "v4_fp8", "v41_packed"])
def test_the_output_rotated_back_in_the_combine_kernel_equals_attention_then_rope(
    ops, gen, dtype, split, pool
):
    """``sparse_attention_unrope``: split-KV rotates the output back in its combine kernel (one program per row),
    one program per head block rotates it in a rope launch after; either way what the plain attention followed by
    ``rope(..., inverse=True)`` gives, and what the reference's composition gives, over plain, V4 FP8 and V4.1
    packed pools."""
    from deepinfer_core.ops.compose import compose_sparse_attention_unrope
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa
    from deepinfer_cuda_sm100.kernels.norm_rope import rope

    c = _inputs(gen, pool, dtype)
    args, p, fr, pack, kernel_fmt, fmt = c.args, c.p, c.fr, c.pack, c.kernel_fmt, c.fmt
    got = sa.sparse_attention(*args, 0.1, kernel_fmt, splits=split, unrope=(p, fr), **pack).cpu()
    two = rope(sa.sparse_attention(*args, 0.1, kernel_fmt, splits=split, **pack), p, fr, inverse=True).cpu()
    assert got.dtype == dtype
    torch.testing.assert_close(
        got.float(), two.float(), atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 8e-3
    )
    want = compose_sparse_attention_unrope(
        REF, *c.host, 0.1, c.pos, c.inv_freq, **fmt, dense=reference_op("dense")
    )
    through_ops = ops.sparse_attention_unrope(*args, 0.1, p, fr, **fmt).cpu()
    assert rel_err(got, want) < BOUND[dtype]
    assert rel_err(through_ops, want) < BOUND[dtype]
    assert rel_err(want, REF.sparse_attention(*c.host, 0.1, **fmt)) > 1e-3, "the rotation changes the output"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("pool", ["plain", "v4_fp8", "v41_packed"])
@pytest.mark.parametrize("q_norm_eps", [None, 1e-6])
def test_the_query_rotated_as_the_kernel_loads_it_equals_rope_then_attention(
    ops, gen, dtype, split, pool, q_norm_eps
):
    """``rope_sparse_attention_unrope``: the kernel norms (``q_norm_eps``, V4's weightless per-head norm) and
    rotates each query row as it loads it, rounding each as the ops round; what the separate rope (or
    rms_norm_rope) launch followed by ``sparse_attention_unrope`` gives, and what the reference's composition
    gives, over plain, V4 FP8 and V4.1 packed pools, with and without split-KV."""
    from deepinfer_core.ops.compose import compose_rope_sparse_attention_unrope
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa
    from deepinfer_cuda_sm100.kernels.norm_rope import rms_norm_rope, rope

    c = _inputs(gen, pool, dtype)
    args, p, fr, pack, kernel_fmt, fmt = c.args, c.p, c.fr, c.pack, c.kernel_fmt, c.fmt
    got = sa.sparse_attention(
        *args, 0.1, kernel_fmt, splits=split, unrope=(p, fr), rope_q=True, q_norm_eps=q_norm_eps, **pack
    ).cpu()
    q_rot = rope(args[0], p, fr) if q_norm_eps is None else rms_norm_rope(args[0], None, q_norm_eps, p, fr)
    two = sa.sparse_attention(q_rot, *args[1:], 0.1, kernel_fmt, splits=split, unrope=(p, fr), **pack).cpu()
    assert got.dtype == dtype
    torch.testing.assert_close(
        got.float(), two.float(), atol=1e-5, rtol=1e-5 if dtype == torch.float32 else 8e-3
    )
    dense = reference_op("dense")
    want = compose_rope_sparse_attention_unrope(
        REF, *c.host, 0.1, c.pos, c.inv_freq, **fmt, dense=dense, q_norm_eps=q_norm_eps
    )
    through_ops = ops.rope_sparse_attention_unrope(*args, 0.1, p, fr, **fmt, q_norm_eps=q_norm_eps).cpu()
    assert rel_err(got, want) < BOUND[dtype]
    assert rel_err(through_ops, want) < BOUND[dtype]
    unrotated = ops.sparse_attention_unrope(*args, 0.1, p, fr, **fmt).cpu()
    assert rel_err(unrotated, want) > 1e-3, "the query's rotation (and norm) changes the output"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["window", "compressed", "keys"])
def test_norm_rope_and_pack_in_one_launch_equals_the_two(ops, gen, dtype, which):
    """``rms_norm_rope_store_kv`` into a V4.1 packed pool: one program norms, rotates and packs each row, byte for
    byte what the norm-rope launch followed by the store gives; in float32 what the reference's composition gives,
    in bf16 what the reference's codec packs from the plugin's norm-rope rows; rows at other slots stay as they
    were."""
    from deepinfer_core.ops.compose import compose_rms_norm_rope_store_kv
    from deepinfer_cuda_sm100.kernels import kv_store
    from deepinfer_cuda_sm100.kernels.norm_rope import rms_norm_rope

    fmt = getattr(_v41_formats(dtype), which)
    T, D, R = 6, 64, 16
    x, w = rand(gen, T, D, dtype=dtype, scale=3.0), (rand(gen, D).abs() + 0.5).to(dtype)
    pos = torch.randint(0, 70000, (T,), generator=gen)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, R, 2).float() / R)
    pool = torch.randint(0, 256, (20, fmt.row_bytes), dtype=torch.uint8, generator=gen)
    slots = torch.randperm(19, generator=gen)[:T]
    args = dev(x, w, pos, inv_freq, slots)
    one, two, ref = dev(pool.clone()), dev(pool.clone()), pool.clone()
    calls = []
    real = kv_store._norm_rope_pack_v41_kernel
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_store, "_norm_rope_pack_v41_kernel", Counting(real, calls))
        ops.rms_norm_rope_store_kv(args[0], args[1], 1e-6, args[2], args[3], one, args[4], fmt)
    assert len(calls) == 1
    rows = rms_norm_rope(args[0][:, None], args[1], 1e-6, args[2], args[3])[:, 0]
    kv_store.store_v41(two, args[4], rows, fmt)
    assert torch.equal(one.cpu(), two.cpu())
    compose_rms_norm_rope_store_kv(
        REF, x, w, 1e-6, pos, inv_freq, ref, slots, fmt, dense=reference_op("dense")
    )
    if dtype == torch.float32:
        assert torch.equal(one.cpu(), ref)
    else:  # bf16 norm-rope rows may differ from the reference's by a step (then a code, or a block's scale):
        # the packing itself is the codec's, byte for byte, on the plugin's rows
        codec = pool.clone()
        REF.store_kv(codec, slots, rows.cpu(), fmt)
        assert torch.equal(one.cpu(), codec)
    others = torch.ones(20, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(one.cpu()[others], pool[others])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", [None, "keys", "window", "compressed"])
def test_the_index_query_in_one_launch_equals_rope_roundtrip_and_the_weights(ops, gen, dtype, which):
    """``index_query`` (V4.1's index query, plugin API 2.12): one program a head rotates the query row, round-trips
    it through the keys' format and scales the head's weight, byte for byte what the rope launch, the round-trip
    launch and torch's ``weights.float() * scale`` give; in float32 what the reference's composition gives."""
    from deepinfer_core.ops.compose import compose_index_query
    from deepinfer_cuda_sm100.kernels import kv_store
    from deepinfer_cuda_sm100.kernels.norm_rope import rope

    fmt = None if which is None else getattr(_v41_formats(dtype), which)
    T, H, D, R = 5, 6, 64, 16
    q = rand(gen, T, H, D, dtype=dtype, scale=3.0)
    q[0, 0, :8] = -0.0  # signed zeros in the unrotated channels stay as they are
    w = rand(gen, T, H, dtype=torch.bfloat16)
    pos = torch.randint(0, 70000, (T,), generator=gen)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, R, 2).float() / R)
    args = dev(q, w, pos, inv_freq)
    calls = []
    real = kv_store._index_query_kernel
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_store, "_index_query_kernel", Counting(real, calls))
        got_q, got_w = ops.index_query(args[0], args[1], 0.0221, args[2], args[3], fmt)
    assert len(calls) == 1
    two = rope(args[0], args[2], args[3])
    if fmt is not None:
        two = kv_store.roundtrip_v41(two.reshape(-1, D), fmt).view(T, H, D)
    assert got_q.dtype == dtype and got_w.dtype == torch.float32
    assert torch.equal(got_q.cpu().view(torch.int8), two.cpu().view(torch.int8))  # signed zeros included
    assert torch.equal(got_w.cpu(), w.float() * 0.0221)
    ref_q, ref_w = compose_index_query(REF, q, w, 0.0221, pos, inv_freq, fmt, dense=reference_op("dense"))
    assert torch.equal(got_w.cpu(), ref_w)
    if fmt is None:  # the rotation alone: torch's sine and cosine against the kernel's, to a rounding step
        assert rel_err(got_q.cpu(), ref_q) < BOUND[dtype]
    elif dtype == torch.float32:  # the codec's grid absorbs the float32 rotation's last bits
        assert torch.equal(got_q.cpu(), ref_q)
    else:  # a bf16 rotation may differ from the reference's by a step, then so may a code: close, not equal
        assert rel_err(got_q.cpu(), ref_q) < 0.05
    assert not torch.equal(got_q.cpu(), q), "the rotation changes the query"


@pytest.mark.parametrize("dtype, pool_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.bfloat16)])  # fmt: skip
def test_norm_rope_and_store_into_a_plain_pool_in_one_launch_equals_the_two(ops, gen, dtype, pool_dtype):
    """``rms_norm_rope_store_kv`` into V4's plain pool: one program norms, rotates and stores each row (padding's
    ``-1`` into the scratch row), byte for byte the norm-rope launch then the store, rounded to the rows' dtype
    then the pool's as the two round; rows at other slots stay as they were; the reference's composition to a
    rounding step."""
    from deepinfer_core.ops.compose import compose_rms_norm_rope_store_kv
    from deepinfer_cuda_sm100.kernels import kv_store, norm_rope

    T, D, R = 6, 64, 16
    x, w = rand(gen, T, D, dtype=dtype, scale=3.0), (rand(gen, D).abs() + 0.5).to(dtype)
    pos = torch.randint(0, 70000, (T,), generator=gen)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, R, 2).float() / R)
    pool = rand(gen, 20, D, dtype=pool_dtype)
    slots = torch.randperm(19, generator=gen)[:T]
    slots[-1] = -1  # a padding row: the scratch row
    args = dev(x, w, pos, inv_freq, slots)
    one, two, ref = dev(pool.clone()), dev(pool.clone()), pool.clone()
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(norm_rope, "_rms_norm_rope_kernel", Counting(norm_rope._rms_norm_rope_kernel, calls))
        mp.setattr(kv_store, "_store_kernel", Counting(kv_store._store_kernel, calls))
        ops.rms_norm_rope_store_kv(args[0], args[1], 1e-6, args[2], args[3], one, args[4], None)
    assert len(calls) == 1
    rows = norm_rope.rms_norm_rope(args[0][:, None], args[1], 1e-6, args[2], args[3])[:, 0]
    kv_store.store_plain(two, args[4], rows)
    assert torch.equal(one.cpu().view(torch.int8), two.cpu().view(torch.int8))
    compose_rms_norm_rope_store_kv(
        REF, x, w, 1e-6, pos, inv_freq, ref, slots, None, dense=reference_op("dense")
    )
    assert rel_err(one.cpu()[slots], ref[slots]) < BOUND[pool_dtype]
    others = torch.ones(20, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(one.cpu()[others], pool[others])
    assert not torch.equal(one.cpu()[slots], pool[slots])
