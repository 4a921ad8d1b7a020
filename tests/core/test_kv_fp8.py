"""The FP8 KV cache format (deepinfer_core.ops.kv_fp8): layout, power-of-two scales, the pack/unpack round trip,
and the reference attention reading packed pools."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.kv_fp8 import E4M3_MAX, GROUP, Fp8KVFormat, is_fp8, power_of_two_scale
from deepinfer_core.ops.reference import ReferenceAttentionOps


def _values(n: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    spread = 2.0 ** torch.randint(-8, 8, (1, d), generator=g).float()  # channels of very different size
    return torch.randn(n, d, generator=g) * spread


def test_v4_flash_entry_is_608_bytes():
    fmt = Fp8KVFormat(512, 64, torch.bfloat16)
    assert (fmt.nope, fmt.num_scales, fmt.rope_offset, fmt.scale_offset, fmt.row_bytes) == (
        448,
        7,
        448,
        576,
        608,
    )
    assert (
        Fp8KVFormat(32, 8, torch.float32).row_bytes == 32 + 32 + 16
    )  # codes 24->32, rope 8x4, one scale->16


@pytest.mark.parametrize("bad", [(32, 32), (32, 7), (32, -2)])
def test_format_rejects_bad_rope_dims(bad):
    with pytest.raises(ValueError, match="rope_dim"):
        Fp8KVFormat(bad[0], bad[1], torch.float32)


def test_is_fp8_names_the_allowed_values():
    assert is_fp8("fp8") and is_fp8("fp8_e4m3") and not is_fp8("auto")
    with pytest.raises(ValueError, match=r"kv_cache_dtype='int8'.*allowed"):
        is_fp8("int8")


def test_power_of_two_scale_is_the_smallest_that_fits():
    g = torch.Generator().manual_seed(1)
    amax = torch.cat(
        [
            torch.rand(2000, generator=g) * 2.0 ** torch.randint(-30, 30, (2000,), generator=g).float(),
            E4M3_MAX * 2.0 ** torch.arange(-5, 6).float(),  # exactly on a boundary
            torch.tensor([1e-30, 0.0]),
        ]
    )
    s = power_of_two_scale(amax)
    mant, _ = torch.frexp(s)
    assert torch.all(mant == 0.5)  # a power of two
    fits = amax.clamp_min(2.0**-100)
    assert torch.all(E4M3_MAX * s >= fits) and torch.all(E4M3_MAX * s / 2 < fits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [(512, 64), (48, 16), (32, 8)])
def test_round_trip_is_close_exact_for_rope_and_stable(dtype, dims):
    d, rope = dims
    fmt = Fp8KVFormat(d, rope, dtype)
    x = _values(37, d).to(dtype)
    rows = fmt.pack(x)
    assert rows.dtype == torch.uint8 and rows.shape == (37, fmt.row_bytes)
    y = fmt.unpack(rows)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y[:, fmt.nope :], x[:, fmt.nope :])  # RoPE channels kept as they are
    # e4m3 keeps 3 mantissa bits: each value within 2**-4 of itself, or within a subnormal step of its group
    err, xf = (y[:, : fmt.nope] - x[:, : fmt.nope]).float().abs(), x[:, : fmt.nope].float()
    scales = (
        rows[:, fmt.scale_offset : fmt.scale_offset + 4 * fmt.num_scales].contiguous().view(torch.float32)
    )
    step = scales.repeat_interleave(GROUP, dim=1)[:, : fmt.nope] * 2.0**-9
    assert torch.all(err <= torch.maximum(xf.abs() * 2.0**-4, step))
    assert float(err.norm() / xf.norm()) < 0.04
    assert torch.equal(fmt.unpack(fmt.pack(y)), y)  # unpacked values are exactly representable: a fixed point


def test_codes_are_the_rounded_e4m3_of_the_scaled_values():
    fmt = Fp8KVFormat(128, 0, torch.float32)
    x = _values(9, 128, seed=4)
    rows = fmt.pack(x)
    scale = power_of_two_scale(x.view(9, 2, GROUP).abs().amax(-1)).repeat_interleave(GROUP, dim=1)
    want = (x / scale).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(rows[:, :128], want)


def test_reference_attention_reads_packed_pools_as_their_unpacked_values():
    g = torch.Generator().manual_seed(5)
    fmt = Fp8KVFormat(48, 16, torch.float32)
    q = torch.randn(4, 3, 48, generator=g)
    kv, cmp = _values(20, 48, 6), _values(9, 48, 7)
    kv_slots = torch.tensor([[0, 3, -1, 7], [1, -1, -1, -1], [19, 2, 5, 6], [-1, -1, -1, -1]])
    cmp_slots = torch.tensor([[0, 8], [3, -1], [-1, -1], [4, 5]])
    sinks = torch.randn(3, generator=g)
    ops = ReferenceAttentionOps()
    packed, pc = fmt.pack(kv), fmt.pack(cmp)
    got = ops.sparse_attention(q, packed, kv_slots, pc, cmp_slots, sinks, 0.1, fmt)
    want = ops.sparse_attention(q, fmt.unpack(packed), kv_slots, fmt.unpack(pc), cmp_slots, sinks, 0.1)
    assert torch.equal(got, want)
    assert float((want - ops.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.1)).abs().max()) > 0


def test_store_kv_packs_into_the_given_slots():
    fmt = Fp8KVFormat(32, 8, torch.float32)
    pool = torch.zeros(10, fmt.row_bytes, dtype=torch.uint8)
    x = _values(3, 32, 8)
    ReferenceAttentionOps().store_kv(pool, torch.tensor([7, 2, 4]), x, fmt)
    assert torch.equal(pool[[7, 2, 4]], fmt.pack(x))
    assert int(pool[[0, 1, 3, 5, 6, 8, 9]].count_nonzero()) == 0
