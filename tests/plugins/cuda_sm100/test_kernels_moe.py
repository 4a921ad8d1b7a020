"""MoE kernels (fused routing, grouped expert GEMM in BF16/FP8/FP4) against the reference MoE ops."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.weights import ExpertWeights
from deepinfer_core.testing.kit import to_device

from .cuda_sm100_helpers import BOUND, DEVICE, INTERPRETED, dev, needs_triton, rand, rel_err

pytestmark = needs_triton
REF = reference_op("moe")


@pytest.fixture(scope="module")
def ops():
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

    return CudaMoEOps()


@pytest.mark.parametrize("score_func", ["sqrtsoftplus", "softmax", "sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("T,E", [(37, 48), (1, 256), (3, 256)])
def test_route_topk_matches_reference(ops, gen, score_func, bias, T, E):
    """37 tokens: a partial token block, 48 experts padded to 64; one and three tokens over 256 experts: the
    one- and four-warp decode programs."""
    logits = rand(gen, T, E, scale=2.0)
    b = rand(gen, E, scale=0.3) if bias else None
    w, ids = ops.route_topk(*dev(logits, b), 6, score_func, 2.5)
    rw, rids = REF.route_topk(logits, b, 6, score_func, 2.5)
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    assert torch.equal(ids.cpu().sort(1).values, rids.sort(1).values)
    order, rorder = ids.cpu().argsort(1), rids.argsort(1)
    assert rel_err(w.cpu().gather(1, order), rw.gather(1, rorder)) < 1e-5
    torch.testing.assert_close(w.sum(1).cpu(), torch.full((T,), 2.5))


def test_route_hash_matches_reference(ops, gen):
    logits = rand(gen, 11, 32)
    ids = torch.randint(0, 32, (11, 6), generator=gen)
    got = ops.route_hash(*dev(logits, ids), "sqrtsoftplus", 1.5)
    assert rel_err(got, REF.route_hash(logits, ids, "sqrtsoftplus", 1.5)) < 1e-5


def _experts(gen, fmt, n, d, i, expert_ids=None):
    def one(o, k):
        w = rand(gen, o, k, scale=0.1)
        if fmt == "fp8_block":
            return quantize_fp8_block(w, "ue8m0")
        if fmt == "fp4_e2m1":
            return quantize_fp4_e2m1(w)
        return w.to(torch.bfloat16)

    w1 = [one(i, d) for _ in range(n)]
    w3 = [one(i, d) for _ in range(n)]
    w2 = [one(d, i) for _ in range(n)]
    return ExpertWeights(w1, w3, w2, expert_ids if expert_ids is not None else list(range(n)))


@pytest.mark.parametrize("fmt", ["plain", "fp8_block", "fp4_e2m1"])
def test_experts_match_reference(ops, gen, gemm_kind, fmt):
    T, k, E, D, inter = 19, 3, 6, 128, 64
    ew = _experts(gen, fmt, E, D, inter)
    x = rand(gen, T, D, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    ids[:12, 0] = 2  # one expert with more rows than a tile holds
    w = torch.rand(T, k, generator=gen) + 0.1
    got = ops.experts(*dev(x, ids, w), to_device(ew, DEVICE), 0.7)
    assert got.dtype == torch.bfloat16
    assert rel_err(got, REF.experts(x, ids, w, ew, 0.7)) < BOUND[torch.bfloat16]


def _experts_at_tiles(ops, gen, monkeypatch, fmt, D, inter, tile_sets: dict) -> tuple[dict, torch.Tensor]:
    """19 tokens routed top-3 over 6 experts (one expert holding more rows than a tile), rows weighted: the plugin's
    experts with the tensor-core tiles forced to each of ``tile_sets`` (``{key: GemmConfig fields}``), and the
    reference's."""
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch

    orig = dispatch.gemm_config
    T, k, E = 19, 3, 6
    ew = _experts(gen, fmt, E, D, inter)
    ew_dev = to_device(ew, DEVICE)
    x = rand(gen, T, D, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    ids[:12, 0] = 2  # one expert with more rows than a tile holds
    w = torch.rand(T, k, generator=gen) + 0.1
    got = {}
    for key, fields in tile_sets.items():
        tiles = dict(gemv=False, block_m=16, block_n=32, **fields)
        monkeypatch.setattr(dispatch, "gemm_config", lambda *a, t=tiles, **kw: replace(orig(*a, **kw), **t))
        got[key] = ops.experts(*dev(x, ids, w), ew_dev, 0.7)
    return got, REF.experts(x, ids, w, ew, 0.7)


@pytest.mark.parametrize("fmt", ["plain", "fp8_block", "fp4_e2m1"])
def test_experts_with_the_weight_tile_as_left_operand_match_reference(ops, gen, fmt, monkeypatch):
    """``swap_ab`` (``C.T = W @ A.T``, SM90's prefill tiles): the gated and the down projection's tiles, rows
    scattered and weighted, against the reference, and equal to the unswapped tiles' result within rounding."""
    tiles = {swap: dict(block_k=64, swap_ab=swap) for swap in (False, True)}
    got, ref = _experts_at_tiles(ops, gen, monkeypatch, fmt, 128, 64, tiles)
    assert rel_err(got[True], ref) < BOUND[torch.bfloat16]
    assert rel_err(got[True], got[False]) < BOUND[torch.bfloat16]


def test_fp4_experts_in_128_deep_k_steps_match_reference(ops, gen, monkeypatch):
    """``fp4_prefill_block_k`` 128: each K step decodes four 32-value scale groups of the weight; the gated and
    the down projection against the reference, and against 64-deep steps within rounding."""
    tiles = {bk: dict(block_k=bk) for bk in (64, 128)}
    got, ref = _experts_at_tiles(ops, gen, monkeypatch, "fp4_e2m1", 256, 128, tiles)
    assert rel_err(got[128], ref) < BOUND[torch.bfloat16]
    assert rel_err(got[128], got[64]) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("split", [1, 3])
def test_experts_all_local_write_every_row_without_a_zero_fill(ops, gen, gemm_kind, split, monkeypatch):
    """Without expert parallelism the down projection's float32 rows, and a split-K workspace, are not
    zero-filled first: every row is written (the buffers start as NaN here), for one-row tiles and for tiles
    of several rows."""
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg
    from deepinfer_cuda_sm100.ops import moe as moe_ops

    empty = torch.empty

    def nan_empty(*a, **k):
        t = empty(*a, **k)
        return t.fill_(float("nan")) if t.dtype == torch.float32 else t

    monkeypatch.setattr(moe_ops.torch, "empty", nan_empty)
    monkeypatch.setattr(gg.torch, "empty", nan_empty)
    orig = dispatch.gemm_config
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: replace(orig(*a, **k), split_k=split))
    for T in (1, 13):
        ew = _experts(gen, "fp8_block", 8, 128, 64)
        x = rand(gen, T, 128, dtype=torch.bfloat16)
        ids = torch.stack([torch.randperm(8, generator=gen)[:3] for _ in range(T)])
        w = torch.rand(T, 3, generator=gen) + 0.1
        got = ops.experts(*dev(x, ids, w), to_device(ew, DEVICE), 0.7)
        assert rel_err(got, REF.experts(x, ids, w, ew, 0.7)) < BOUND[torch.bfloat16], T


def test_experts_skip_ids_owned_by_other_ranks(ops, gen, gemm_kind):
    """Expert parallelism: this rank holds global experts 4, 5 and 9 only; other ids add nothing."""
    T, k, D, inter = 8, 2, 64, 32
    ew = _experts(gen, "plain", 3, D, inter, expert_ids=[4, 9, 5])
    x = rand(gen, T, D, dtype=torch.bfloat16)
    ids = torch.randint(0, 12, (T, k), generator=gen)
    ids[0] = torch.tensor([1, 2])  # a row with no local expert at all
    w = torch.rand(T, k, generator=gen) + 0.1
    got = ops.experts(*dev(x, ids, w), to_device(ew, DEVICE), 0.0)
    ref = REF.experts(x, ids, w, ew, 0.0)
    assert torch.equal(got[0].cpu(), torch.zeros(D, dtype=torch.bfloat16))
    assert rel_err(got, ref) < BOUND[torch.bfloat16]


@pytest.fixture
def split_k(monkeypatch):
    """Force K to be split in 3 slices (float32 partials + the fixed-order epilogue) in every grouped GEMM."""
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch

    orig = dispatch.gemm_config
    monkeypatch.setattr(dispatch, "gemm_config", lambda *a, **k: replace(orig(*a, **k), split_k=3))


@pytest.mark.parametrize("fmt", ["plain", "fp8_block", "fp4_e2m1"])
def test_experts_with_split_k_match_reference(ops, gen, gemm_kind, split_k, fmt):
    T, k, E, D, inter = 11, 2, 5, 256, 192  # K = 256 and 192: two and three slices
    ew = _experts(gen, fmt, E, D, inter, expert_ids=[7, 1, 3, 0, 2])
    x = rand(gen, T, D, dtype=torch.bfloat16)
    ids = torch.randint(0, 9, (T, k), generator=gen)  # ids 4, 5, 6, 8 live on other ranks
    w = torch.rand(T, k, generator=gen) + 0.1
    got = ops.experts(*dev(x, ids, w), to_device(ew, DEVICE), 0.7)
    assert rel_err(got, REF.experts(x, ids, w, ew, 0.7)) < BOUND[torch.bfloat16]
    if not INTERPRETED:  # the interpreter runs programs one after another: a repeat there could not differ
        again = ops.experts(*dev(x, ids, w), to_device(ew, DEVICE), 0.7)
        assert torch.equal(got.cpu(), again.cpu()), "split-K sums in a fixed order: results repeat exactly"


def test_fp4_scales_read_as_ue8m0_bytes_only_when_powers_of_two(gen):
    from deepinfer_cuda_sm100.kernels.grouped_gemm import ue8m0_bytes

    exps = torch.randint(-126, 128, (5, 7), generator=gen)
    pow2 = torch.exp2(exps.double()).float()
    (b,) = ue8m0_bytes([pow2])
    assert b.dtype == torch.uint8
    assert torch.equal(b.long() - 127, exps)
    for bad in (pow2 * 1.5, -pow2, torch.zeros(5, 7), pow2.to(torch.bfloat16)):
        assert ue8m0_bytes([pow2, bad])[1] is bad, "one scale that is not a power of two keeps all float32"


def test_experts_with_float32_fp4_scales_match_reference(ops, gen, gemm_kind):
    """FP4 scales that are not powers of two stay float32 in every kernel."""
    from deepinfer_core.ops.weights import QuantizedWeight

    T, k, E, D, inter = 9, 2, 4, 64, 96
    ew = _experts(gen, "fp4_e2m1", E, D, inter)

    def odd(w):
        return QuantizedWeight(
            w.data, w.scale * (1 + torch.rand(w.scale.shape, generator=gen)), w.format, w.shape
        )

    ew = ExpertWeights(
        [odd(w) for w in ew.w1], [odd(w) for w in ew.w3], [odd(w) for w in ew.w2], ew.expert_ids
    )
    x = rand(gen, T, D, dtype=torch.bfloat16)
    ids = torch.randint(0, E, (T, k), generator=gen)
    w = torch.rand(T, k, generator=gen) + 0.1
    got = ops.experts(*dev(x, ids, w), to_device(ew, DEVICE), 0.0)
    assert rel_err(got, REF.experts(x, ids, w, ew, 0.0)) < BOUND[torch.bfloat16]


def _prmt(x: int, sel: int) -> int:
    """PTX ``prmt.b32 d, x, 0, sel`` (default mode, no sign replication: selector nibbles < 8)."""
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [0, 0, 0, 0]
    return sum(src[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def test_fp4_ptx_decode_bit_logic_matches_e2m1(gen):
    """``gemv.e2m1_bf16_scaled``'s PTX cannot run here; its bit logic, emulated from the same constants the
    PTX is built from, turns every byte into its two codes' values times the scale, exactly."""
    from deepinfer_core.ops.quant_formats import _e2m1_lut
    from deepinfer_cuda_sm100.kernels import gemv

    lut = _e2m1_lut(torch.device("cpu"))
    for const in (
        *gemv.E2M1_BF16_PRMT,
        gemv.E2M1_BF16_MASK,
        *(c for pair in gemv.E2M1_BF16_SPREAD.values() for c in pair),
    ):
        assert f"{const:#x}" in gemv.E2M1_BF16_PTX.value
    for e in (1, 100, 120, 127, 128):  # ue8m0 bytes the PTX path takes (<= 128)
        s_bits = (e + 126) << 7  # gemv.e8m0_bf16_unit
        s = torch.tensor([s_bits], dtype=torch.int16).view(torch.bfloat16).float()
        for word in range(0, 256, 4):
            x = word | (word + 1) << 8 | (word + 2) << 16 | (word + 3) << 24
            for pair, sel in enumerate(gemv.E2M1_BF16_PRMT):
                y = _prmt(x, sel)
                for half, shift in (("lo", 0), ("hi", 4)):
                    mask, mul = gemv.E2M1_BF16_SPREAD[half]
                    t = (((y & mask) * mul) & 0xFFFFFFFF) & gemv.E2M1_BF16_MASK
                    for h in range(2):
                        bits = (t >> (16 * h)) & 0xFFFF
                        got = (
                            torch.tensor([bits], dtype=torch.int32)
                            .to(torch.int16)
                            .view(torch.bfloat16)
                            .float()
                        )
                        byte = word + 2 * pair + h
                        want = lut[(byte >> shift) & 0xF] * 2.0 ** (e - 127)
                        assert (got * s).to(torch.bfloat16).item() == want.item(), (e, byte, half)


def test_combine_sums_each_tokens_expert_rows_in_order(gen):
    """The MoE combine kernel: per token, the ``k`` float32 rows summed in order and cast: exactly a sequential
    float32 sum, and torch's sum to rounding."""
    from deepinfer_cuda_sm100.kernels.combine import combine

    T, k, D = 5, 6, 1100  # D: a partial channel block
    y = rand(gen, T * k, D, scale=4.0)
    for dtype in (torch.float32, torch.bfloat16):
        got = combine(dev(y), k, dtype).cpu()
        assert got.dtype == dtype and got.shape == (T, D)
        seq = y.view(T, k, D)[:, 0].clone()
        for j in range(1, k):
            seq += y.view(T, k, D)[:, j]
        if dtype == torch.float32:  # (the interpreter's bfloat16 cast truncates; the GPU's rounds to nearest)
            assert torch.equal(got, seq)
        assert rel_err(got, y.view(T, k, D).sum(1).to(dtype)) < BOUND[dtype]
    assert combine(dev(y[:0]), k, torch.float32).shape == (0, D)


def _run_ptx(ptx: str, args: list[int]) -> int:
    """Execute the straight-line PTX of ``fp4_pairs.E2M1_F16_DOT_PTX`` (the instructions it uses, with their PTX ISA
    semantics) on 32-bit inputs ``$1..``; returns ``$0``'s bits. Float16 pair ops round once (``fma``)."""
    import numpy as np

    def f16(bits):
        return np.array([bits & 0xFFFF], dtype=np.uint16).view(np.float16)[0]

    def bits16(v):
        return int(np.array([v], dtype=np.float16).view(np.uint16)[0])

    def f16x2(op, *regs):  # each half: op on float64 values, rounded once to float16
        return sum(bits16(op(*(float(f16(r >> (16 * h))) for r in regs))) << (16 * h) for h in range(2))

    reg = {f"${i + 1}": a for i, a in enumerate(args)}

    def val(x):
        return int(x, 16) if x.startswith("0x") else int(x) if x.isdigit() else reg[x]

    ops = {"shl.b32": lambda a, b: (a << b) & 0xFFFFFFFF, "shr.b32": lambda a, b: a >> b,
           "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b,
           "mul.rn.f16x2": lambda a, b: f16x2(lambda x, y: x * y, a, b),
           "fma.rn.f16x2": lambda a, b, c: f16x2(lambda x, y, z: x * y + z, a, b, c)}  # fmt: skip
    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if rest.startswith("{"):  # mov.b32 {h0, h1}, acc
            names, src = rest[1:].split("}, ")
            lo, hi = (n.strip() for n in names.split(","))
            reg[lo], reg[hi] = reg[src] & 0xFFFF, reg[src] >> 16
            continue
        dst, *srcs = (x.strip() for x in rest.split(","))
        if op == "prmt.b32":
            b = val(srcs[0]) | val(srcs[1]) << 32
            reg[dst] = sum(((b >> (8 * ((val(srcs[2]) >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        elif op == "cvt.f32.f16":
            reg[dst] = np.float32(f16(reg[srcs[0]]))
        elif op == "add.f32":
            reg[dst] = np.float32(reg[srcs[0]] + reg[srcs[1]])
        elif op == "mov.b32":
            reg[dst] = reg[srcs[0]]
        else:
            reg[dst] = ops[op](*(val(s) for s in srcs))
    return int(np.array([reg["$0"]], dtype=np.float32).view(np.uint32)[0])


def test_fp4_f16_pair_ptx_computes_the_word_dot(gen):
    """``fp4_pairs.E2M1_F16_DOT_PTX``, executed instruction by instruction: a weight word's 8 e2m1 codes (every
    byte value occurs) times their 8 float16 activations: exactly the float64 sum times ``2**-14`` when the
    products and lane sums are exact in float16 (activations that are small integers), else within float16
    rounding."""
    import numpy as np

    from deepinfer_core.ops.quant_formats import _e2m1_lut
    from deepinfer_cuda_sm100.kernels import fp4_pairs

    lut = _e2m1_lut(torch.device("cpu")).double()
    ptx = fp4_pairs.E2M1_F16_DOT_PTX.value
    for c in (*fp4_pairs.E2M1_F16_PRMT, fp4_pairs.E2M1_F16_SIGN, fp4_pairs.E2M1_F16_EM):
        assert f"{c:#x}" in ptx
    words = torch.randint(0, 2**32, (64,), generator=gen, dtype=torch.int64).tolist()
    words += [b * 0x01010101 for b in range(256)]  # every byte value in every byte
    for i, word in enumerate(words):
        x = torch.randint(-8, 9, (8,), generator=gen).double()  # exact in float16, as are products and sums
        if i % 3 == 0:
            x = torch.randn(8, generator=gen, dtype=torch.float64) * 100  # general values: rounding
        xh = x.to(torch.float16)
        pairs = xh.view(torch.int16).to(torch.int64) & 0xFFFF
        regs = [int(pairs[k] | pairs[k + 2] << 16) for k in (0, 1, 4, 5)]
        got = np.array([_run_ptx(ptx, [word, *regs])], dtype=np.uint32).view(np.float32)[0]
        codes = torch.tensor([(word >> (4 * k)) & 0xF for k in range(8)])
        want = float((lut[codes] * xh.double()).sum()) * 2.0**-14
        if i % 3 == 0:
            assert (
                abs(got - want)
                <= 2e-3 * float((lut[codes].abs() * xh.double().abs()).sum()) * 2.0**-14 + 1e-30
            )
        else:
            assert got == np.float32(want), (hex(word), x.tolist())


@pytest.mark.parametrize("fmt", ["plain", "fp8_block", "fp4_e2m1"])
def test_split_k_finished_by_the_last_slice_equals_the_epilogue_launch(gen, gemm_kind, fmt, monkeypatch):
    """``dispatch.split_finish``: each output tile's last K slice sums the partials and runs the epilogue, so no
    ``_splitk_epilogue_kernel`` launch; the same floats as that launch (same order), for experts (all local:
    every row tiled), a dense linear and a grouped linear; the tile counters are zero again afterwards."""
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg
    from deepinfer_cuda_sm100.kernels._common import arrival_counters
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

    orig = dispatch.gemm_config
    T, k, E, D, inter = 7, 2, 4, 256, 192  # K = 256 and 192: two and three slices
    ew = to_device(_experts(gen, fmt, E, D, inter), DEVICE)
    x = rand(gen, T, D, dtype=torch.bfloat16)
    ids = torch.randint(0, E, (T, k), generator=gen)
    w = torch.rand(T, k, generator=gen) + 0.1
    wl = [to_device(q, DEVICE) for q in _experts(gen, fmt, 3, D, 96).w1]  # three [96, 256] weights

    def run(finish: bool):
        cfg = lambda *a, **kw: replace(orig(*a, **kw), split_k=3, split_finish=finish)  # noqa: E731
        monkeypatch.setattr(dispatch, "gemm_config", cfg)
        dense = CudaDenseOps()
        xd = dev(x)
        return (CudaMoEOps().experts(xd, *dev(ids, w), ew, 0.7), dense.linear(xd, wl[0]),
                dense.grouped_linear(dev(rand(gen.manual_seed(5), T, 3, D, dtype=torch.bfloat16)), wl))  # fmt: skip

    want = run(False)
    real, empty = gg._splitk_epilogue_kernel, torch.empty
    monkeypatch.setattr(gg, "_splitk_epilogue_kernel", None)  # any launch of it now fails

    # workspaces start as NaN: a slice that finished before every partial was written would show
    def nan_empty(*a, **kw):
        t = empty(*a, **kw)
        return t.fill_(float("nan")) if t.dtype == torch.float32 else t

    monkeypatch.setattr(gg.torch, "empty", nan_empty)
    got = run(True)
    monkeypatch.setattr(gg.torch, "empty", empty)
    monkeypatch.setattr(gg, "_splitk_epilogue_kernel", real)
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b.cpu())
    assert (
        rel_err(got[0], REF.experts(x, ids, w, to_device(ew, torch.device("cpu")), 0.7))
        < BOUND[torch.bfloat16]
    )
    assert not arrival_counters(DEVICE).any()
