"""V4's FP8 KV cache in the attention kernels: the one-launch store writes the reference's bytes, and the sparse
attention decodes the packed rows (e4m3 codes, a power-of-two scale per 64 channels, RoPE channels in the model
dtype) exactly as ``Fp8KVFormat.unpack`` does."""

from __future__ import annotations

import functools

import pytest
import torch

from deepinfer_core.ops.reference import reference_op

from .cuda_sm100_helpers import (
    BOUND,
    DEVICE,
    INTERPRETED,
    dev,
    needs_triton,
    rand,
    rel_err,
    slot_lists,
    spread_rows,
)

try:
    import triton
    import triton.language as tl

    from deepinfer_cuda_sm100.kernels.sparse_attention import _load_kv
except ImportError:  # no Triton: needs_triton skips every test here
    triton = tl = _load_kv = None

pytestmark = needs_triton
REF = reference_op("attention")


@pytest.fixture(scope="module")
def ops():
    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps

    return CudaAttentionOps()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [(512, 64), (48, 16), (32, 8)])
def test_fp8_kv_store_writes_the_reference_bytes(gen, dtype, dims):
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100.kernels.kv_store import store_fp8

    fmt = Fp8KVFormat(*dims, dtype)
    x = spread_rows(gen, 9, dims[0]).to(dtype)
    x[3, :7] = 0.0  # an all-small row start: the scale comes from the rest of its group
    slots = torch.tensor([11, 0, 5, 7, 2, -1, 9, 3, 13])  # -1: the last (scratch) slot, as torch indexes it
    pool = torch.zeros(16, fmt.row_bytes, dtype=torch.uint8, device=DEVICE)
    store_fp8(pool, *dev(slots, x), fmt)
    want = torch.zeros(16, fmt.row_bytes, dtype=torch.uint8)
    want[slots] = fmt.pack(x)
    assert torch.equal(pool.cpu(), want)


@pytest.mark.parametrize("gather", [False, True], ids=["scales_reshaped", "scales_gathered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_attention_reads_fp8_pools(ops, gen, dtype, gather):
    """Both ways the kernel scales the codes (``dispatch.fp8_kv_mode``) read the reference's values."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100 import dispatch, settings

    settings.use(settings.CudaSM100Settings(fp8_kv_scale_gather=gather))
    assert dispatch.fp8_kv_mode() == (2 if gather else 1)
    T, H, D = 5, 20, 80  # nope 64 + RoPE 16; D=80: a partial channel tile
    fmt = Fp8KVFormat(D, 16, dtype)
    q = rand(gen, T, H, D, dtype=dtype)
    kv, cmp = fmt.pack(spread_rows(gen, 70, D)), fmt.pack(spread_rows(gen, 30, D))
    kv_slots, cmp_slots = slot_lists(gen, T, 37, 70), slot_lists(gen, T, 19, 30)
    sinks = rand(gen, H)
    got = ops.sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.05, fmt)
    ref = REF.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.05, fmt)
    assert got.dtype == dtype
    assert rel_err(got, ref) < BOUND[dtype]
    plain = REF.sparse_attention(q, fmt.unpack(kv), kv_slots, fmt.unpack(cmp), cmp_slots, sinks, 0.05)
    assert torch.equal(ref, plain)  # the packed read is the unpacked values, nothing else


@pytest.mark.parametrize("D, rope", [(80, 16), (576, 64)])
def test_fp8_kv_scales_gathered_give_the_reshaped_result_bit_for_bit(gen, D, rope):
    """The gathered scales multiply the same code by the same scale as the reshaped ones: equal outputs, on a
    partial channel tile and on V4's 448 + 64 rows (seven groups of 64 in a 1,024-wide tile)."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.kernels.sparse_attention import sparse_attention

    T, H = 3, 16
    fmt = Fp8KVFormat(D, rope, torch.float32)
    q = rand(gen, T, H, D)
    kv, cmp = fmt.pack(spread_rows(gen, 50, D)), fmt.pack(spread_rows(gen, 20, D))
    kv_slots, cmp_slots = slot_lists(gen, T, 29, 50), slot_lists(gen, T, 11, 20)
    sinks = rand(gen, H)
    outs = []
    for gather in (False, True):
        settings.use(settings.CudaSM100Settings(fp8_kv_scale_gather=gather))
        outs.append(sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.05, fmt).cpu())
    assert torch.equal(outs[0], outs[1])
    ref = REF.sparse_attention(q, kv, kv_slots, cmp, cmp_slots, sinks, 0.05, fmt)
    assert rel_err(outs[1], ref) < BOUND[torch.float32]


@pytest.mark.skipif(
    not INTERPRETED, reason="bit for bit needs the same tiles for both pools (the interpreter's)"
)
@pytest.mark.parametrize("D, rope", [(80, 16), (576, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_kv_attention_is_the_plain_pool_of_its_unpacked_rows(gen, D, rope, dtype):
    """The kernel's FP8 read builds each key tile as ``Fp8KVFormat.unpack`` then the dot's cast would: the output
    over a packed pool is, byte for byte, the output over a plain pool holding the unpacked rows (the same tiles
    under the interpreter), on a partial channel tile and on V4's 448 + 64 rows."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100.kernels.sparse_attention import sparse_attention

    fmt = Fp8KVFormat(D, rope, dtype)
    q, kv, kv_slots, cmp, cmp_slots, sinks = _fp8_inputs(gen, fmt)
    packed = sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.05, fmt).cpu()
    plain = sparse_attention(*dev(q, fmt.unpack(kv), kv_slots, fmt.unpack(cmp), cmp_slots, sinks), 0.05).cpu()
    assert packed.dtype == plain.dtype == dtype
    assert torch.equal(packed, plain)


def _fp8_inputs(gen, fmt):
    """Three tokens' queries (16 heads), a 50-row window pool and a 20-row compressed pool packed by ``fmt``, each
    token's slot lists into both (29 and 11 slots), and the sinks."""
    T, H, D, dtype = 3, 16, fmt.head_dim, fmt.rope_dtype
    q = rand(gen, T, H, D, dtype=dtype)
    kv, cmp = fmt.pack(spread_rows(gen, 50, D).to(dtype)), fmt.pack(spread_rows(gen, 20, D).to(dtype))
    return q, kv, slot_lists(gen, T, 29, 50), cmp, slot_lists(gen, T, 11, 20), rand(gen, H)


@functools.cache
def _load_kv_probe():
    """A kernel that stores the ``[BLOCK_N, BLOCK_D]`` key tile ``_load_kv`` builds."""
    return triton.jit(_probe_source)


def _probe_source(pool_ptr, rope_ptr, scale_ptr, slots_ptr, out_ptr, N, D, stride_pool, NOPE, NG, ROPE_ROW, ROPE_OFF,
                  SCALE_ROW, SCALE_OFF, FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, OUT_T: tl.constexpr):  # fmt: skip
    n = tl.arange(0, BLOCK_N)
    slot = tl.load(slots_ptr + n, mask=n < N, other=-1)
    d = tl.arange(0, BLOCK_D)
    k = _load_kv(pool_ptr, rope_ptr, scale_ptr, slot, slot >= 0, d, d < D, stride_pool, NOPE, NG, ROPE_ROW,
                 ROPE_OFF, SCALE_ROW, SCALE_OFF, FP8, GROUP, BLOCK_N, BLOCK_D, OUT_T)  # fmt: skip
    tl.store(out_ptr + n[:, None] * D + d[None, :], k, mask=(n < N)[:, None] & (d < D)[None, :])


@pytest.mark.parametrize("gather", [False, True], ids=["scales_reshaped", "scales_gathered"])
@pytest.mark.parametrize("D, rope", [(80, 16), (576, 64)])
@pytest.mark.parametrize("out", ["bf16", "f32"])
def test_fp8_kv_tile_in_the_dots_type_is_the_unpacked_rows(gen, D, rope, gather, out):
    """The FP8 key tile as the attention kernel builds it (``_load_kv``) in bf16, the dot's type on a GPU (the
    interpreter's attention dots run in float32, so the attention tests above never take this route): the codes
    times their scales, rounded to bf16, merged with the RoPE channels in bf16, are ``Fp8KVFormat.unpack``'s rows
    exactly; in float32 too. Scales down to about 2**-100 (an all-zero row, tiny groups); empty slots read zero."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100.kernels.sparse_attention import _views

    fmt = Fp8KVFormat(D, rope, torch.bfloat16)
    x = spread_rows(gen, 12, D)
    x[3] = 0.0  # an all-zero row: the smallest scale
    x[5, : D - rope] *= 2.0**-90  # tiny groups: scales near 2**-100
    pool = fmt.pack(x.to(torch.bfloat16))
    slots = torch.tensor([0, 1, 2, 3, 4, 5, -1, 6, 7, 8, 9, 10, 11, -1, 2, 5])
    dtype = torch.bfloat16 if out == "bf16" else torch.float32
    got = torch.zeros(16, D, dtype=dtype)
    rs = fmt.rope_dtype.itemsize
    layout = (fmt.nope, fmt.num_scales, fmt.row_bytes // rs, fmt.rope_offset // rs, fmt.row_bytes // 4,
              fmt.scale_offset // 4)  # fmt: skip
    pool_d, got_d, slots_d = dev(pool, got, slots)
    _load_kv_probe()[(1,)](*_views(pool_d, fmt), slots_d, got_d, 16, D, pool.stride(0), *layout, FP8=2 if gather else 1,
                GROUP=64, BLOCK_N=16, BLOCK_D=triton.next_power_of_2(D),
                OUT_T=tl.bfloat16 if out == "bf16" else tl.float32)  # fmt: skip
    rows = fmt.unpack(pool).to(dtype)
    want = torch.where((slots >= 0)[:, None], rows[slots.clamp(min=0)], torch.zeros((), dtype=dtype))
    assert torch.equal(got_d.cpu(), want)


def test_fp8_kv_store_rounds_ties_to_even_like_torch():
    """Every midpoint between neighbouring e4m3 values (normal and subnormal), both signs, with a group
    amax of 448 (scale 1): the kernel's float32 rounding must pick torch's even neighbour each time."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100.kernels.kv_store import store_fp8

    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (grid[1:] + grid[:-1]) / 2
    vals = torch.cat([mids, -mids, grid, -grid])
    rows = -(-vals.numel() // 63)
    body = torch.zeros(rows * 63)
    body[: vals.numel()] = vals
    x = torch.cat([torch.full((rows, 1), 448.0), body.view(rows, 63)], dim=1)
    fmt = Fp8KVFormat(64, 0, torch.float32)
    pool = torch.zeros(rows, fmt.row_bytes, dtype=torch.uint8, device=DEVICE)
    store_fp8(pool, *dev(torch.arange(rows), x), fmt)
    assert torch.equal(pool.cpu(), fmt.pack(x))


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


def _as_on_sm90(monkeypatch):
    """Dispatch as on an H100 (its attention tiles and split-KV counts; PDL off, which the interpreter lacks), the
    dots still in float32 as the interpreter needs them."""
    from deepinfer_cuda_sm100 import dispatch, settings

    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "num_sms", lambda: 132)
    active = settings.active()
    settings.use(settings.CudaSM100Settings(pdl=False))
    return lambda: settings.use(active)


@pytest.mark.parametrize("rope_apart", [False, True], ids=["merged", "rope_apart"])
@pytest.mark.parametrize("T", [2, 3])
def test_fp8_attention_with_every_head_in_one_program_matches_reference(ops, gen, monkeypatch, T, rope_apart):
    """The tile a GPU dispatches for V4's FP8 rows from two query rows on: all 64 heads of 512 channels a program,
    32 slots a tile, split-KV into chunks and their combine, against the reference in float32 over the unpacked
    rows (the bf16 reference's own roundings are 1e-2 of these rows). ``rope_apart``: the RoPE channels as a tile
    of their own (``settings.fp8_kv_rope_apart``), stored into the split-KV partials from their own accumulator."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100 import dispatch, settings

    restore = _as_on_sm90(monkeypatch)
    settings.use(settings.CudaSM100Settings(pdl=False, fp8_kv_rope_apart=rope_apart))
    assert dispatch.fp8_kv_mode() == (3 if rope_apart else 1)
    try:
        H, D = 64, 512
        assert dispatch.attention_config(T, H, D, 96, fp8=True) == dispatch.AttentionConfig(64, 32, 8, 2)
        fmt = Fp8KVFormat(D, 64, torch.bfloat16)
        q = rand(gen, T, H, D, dtype=torch.bfloat16)
        kv, cmp = fmt.pack(spread_rows(gen, 50, D)), fmt.pack(spread_rows(gen, 30, D))
        kv_slots, cmp_slots = slot_lists(gen, T, 64, 50), slot_lists(gen, T, 32, 30)
        sinks = rand(gen, H)
        got = ops.sparse_attention(*dev(q, kv, kv_slots, cmp, cmp_slots, sinks), 0.05, fmt)
    finally:
        restore()
    ref = REF.sparse_attention(q.float(), fmt.unpack(kv).float(), kv_slots, fmt.unpack(cmp).float(), cmp_slots, sinks,
                               0.05)  # fmt: skip
    assert rel_err(got, ref) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "D, rope, apart", [(128, 32, True), (512, 64, True), (80, 16, False), (576, 64, False)]
)
def test_fp8_kv_rope_apart_reads_the_reference_values(gen, monkeypatch, dtype, D, rope, apart):
    """``settings.fp8_kv_rope_apart`` (``FP8 = 3``): the RoPE channels as their own key tile, with dots of their own
    and their own accumulator, one program per token and head block (no split) and split-KV: the reference's
    output over the unpacked rows (in float32: the bf16 reference's own roundings are 1e-2 of these rows). Where a
    row's RoPE channels are not the tile's last power-of-two group (80 = 64 + 16 in a 128-wide tile; 576 = 512 + 64
    in a 1,024-wide one) the kernel merges them as before: the bytes of the setting off."""
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_cuda_sm100 import settings
    from deepinfer_cuda_sm100.kernels import sparse_attention as sa

    fmt = Fp8KVFormat(D, rope, dtype)
    q, kv, kv_slots, cmp, cmp_slots, sinks = _fp8_inputs(gen, fmt)
    ref = REF.sparse_attention(q.float(), fmt.unpack(kv).float(), kv_slots, fmt.unpack(cmp).float(), cmp_slots, sinks,
                               0.05)  # fmt: skip
    modes, real = [], sa._sparse_attn_kernel

    class Spy:  # the kernel's FP8 mode at each launch
        def __getitem__(self, grid):
            def launch(*a, **k):
                modes.append(k["FP8"])
                return real[grid](*a, **k)

            return launch

    monkeypatch.setattr(sa, "_sparse_attn_kernel", Spy())
    for splits in (1, 3):
        outs = []
        for on in (False, True):
            settings.use(settings.CudaSM100Settings(fp8_kv_rope_apart=on))
            args = dev(q, kv, kv_slots, cmp, cmp_slots, sinks)
            outs.append(sa.sparse_attention(*args, 0.05, fmt, splits=splits).cpu())
        assert rel_err(outs[1], ref) < BOUND[dtype], splits
        if not apart:
            assert torch.equal(outs[0], outs[1])
    assert modes == [1, 3 if apart else 1] * 2
