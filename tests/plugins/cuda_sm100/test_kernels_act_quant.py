"""The activation quantiser kernel (V4.1's release numerics, ``activation_quant="fp8"``) bit for bit against the
core's ``fp8_act_roundtrip`` (itself the quantiser of DeepSeek's reference, ``tests/ops/test_kv_quant.py``), and
the plugin's GEMMs with marked weights against the reference ops."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.act_quant import fp8_act_roundtrip as core_roundtrip
from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.reference import reference_op

from .cuda_sm100_helpers import DEVICE, needs_triton

pytestmark = needs_triton


def _hard_rows(gen: torch.Generator, k: int) -> torch.Tensor:
    """Random rows of several magnitudes, plus the cases a rounding rule can get wrong: values exactly halfway
    between two e4m3 values (ties to even), e4m3 subnormals, a block whose amax is below the 1e-4 clamp, an all-zero
    block, negative zeros, and a block whose amax / 448 is an exact power of two (the scale is not rounded up)."""
    rows = [torch.randn(k, generator=gen) * 10.0 ** float(e) for e in (-3, 0, 2)]
    special = torch.randn(k, generator=gen)
    special[:32] = torch.tensor([1.0, 1.0625, 1.1875, -1.3125] * 8) * 2.0**-3  # halfway between e4m3 values
    special[0] = 448.0 * 2.0**-3  # amax / 448 = 2**-3 exactly
    special[32:64] = torch.randn(32, generator=gen) * 1e-6  # amax below the clamp
    if k >= 128:
        special[64:96] = 0.0
        special[96:128] = -0.0
    rows.append(special)
    tiny = torch.randn(k, generator=gen)
    tiny[::7] *= 2.0**-12  # e4m3 subnormals after scaling
    rows.append(tiny)
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 160, 2304])
def test_the_kernel_round_trip_equals_the_core_bit_for_bit(gen, dtype, k):
    from deepinfer_cuda_sm100.kernels.act_quant import fp8_act_roundtrip

    x = _hard_rows(gen, k).to(dtype)
    got = fp8_act_roundtrip(x.to(DEVICE))
    want = core_roundtrip(x)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got.cpu().view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))  # fmt: skip
    assert not torch.equal(want, x), "the round trip changed nothing: the test would not see a missing one"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_negative_values_that_round_to_zero_keep_their_sign_under_tritons_older_unary_minus(
    gen, monkeypatch, dtype
):
    """Triton 3.6 (the H200's) lowers a float's unary minus as ``0 - x``, which makes +0.0 of +0.0: the kernel gave
    +0.0 where the core gives -0.0 for a negative value that rounds to zero (found on the GPU, v25). Here the
    interpreter's unary minus is made Triton 3.6's, and blocks of tiny negative values beside a large one (they
    round to zero) must still come back -0.0, bit for bit as the core."""
    from triton.language.semantic import TritonSemantic

    from deepinfer_cuda_sm100.kernels.act_quant import fp8_act_roundtrip

    def minus_36(self, x):  # triton 3.6.0 language/semantic.py: TritonSemantic.minus
        zero = self.tensor(self.builder.get_null_value(x.type.scalar.to_ir(self.builder)), x.type.scalar)
        return self.sub(zero, x, True)

    monkeypatch.setattr(TritonSemantic, "minus", minus_36)
    x = -torch.rand(4, 128, generator=gen) * 1e-6 - 1e-7  # |y| < 2**-10 after scaling: rounds to zero
    x[:, ::32] = torch.randn(4, 4, generator=gen).abs() + 1.0  # each block's amax, kept
    x = x.to(dtype)
    got = fp8_act_roundtrip(x.to(DEVICE)).cpu()
    want = core_roundtrip(x)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert int(torch.signbit(want).sum()) == 4 * 124  # the case is here: -0.0 in the core's result
    assert torch.equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_weights_scale_each_row_before_it_is_quantised(gen, dtype):
    """The routed experts' down projection: ``(w * h).to(dtype)``, then the round trip (the release's order)."""
    from deepinfer_cuda_sm100.kernels.act_quant import fp8_act_roundtrip

    h = _hard_rows(gen, 96).to(dtype)
    w = torch.rand(h.shape[0], generator=gen) + 0.1
    got = fp8_act_roundtrip(h.to(DEVICE), row_w=w.to(DEVICE))
    want = core_roundtrip((h.float() * w[:, None]).to(dtype))
    assert torch.equal(got.cpu().float(), want.float())


def test_a_width_off_the_block_is_refused():
    from deepinfer_cuda_sm100.kernels.act_quant import fp8_act_roundtrip

    with pytest.raises(ValueError, match="multiple of 32"):
        fp8_act_roundtrip(torch.zeros(2, 48, device=DEVICE))


def _marked(w):
    w.act_block = 32
    return w


@pytest.mark.parametrize("fmt", ["fp8_block32", "fp4_e2m1"])
@pytest.mark.parametrize("rows", [1, 5, 70])
def test_linear_with_a_marked_weight_quantises_its_input(gen, fmt, rows):
    """The plugin's ``linear`` (GEMV at one row, tensor-core tiles above) against the reference's, and not
    against the unquantised product (so a kernel that skipped the round trip would fail)."""
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    w = torch.randn(96, 256, generator=gen) * 256**-0.5
    q = quantize_fp8_block(w, "ue8m0", 32) if fmt == "fp8_block32" else quantize_fp4_e2m1(w)
    x = torch.randn(rows, 256, generator=gen)
    want = reference_op("dense").linear(x, _marked(q))
    plain = reference_op("dense").linear(x, quantize_fp8_block(w, "ue8m0", 32) if fmt == "fp8_block32" else
                                         quantize_fp4_e2m1(w))  # fmt: skip
    q_dev = type(q)(q.data.to(DEVICE), q.scale.to(DEVICE), q.format, q.shape, 32)
    got = CudaDenseOps().linear(x.to(DEVICE), q_dev).cpu()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (got - plain).abs().max() > 1e-3


@pytest.mark.parametrize("tokens", [1, 40])
def test_routed_experts_scale_then_quantise_the_down_projections_input(gen, tokens):
    """The plugin's ``experts`` with FP4 experts marked for the release's numerics, at a decode size (the fused
    one-launch schedule) and a prefill size, against the reference's (which scales each row by its routing weight
    before the round trip, as DeepSeek's ``Expert.forward`` does)."""
    from deepinfer_core.ops.weights import ExpertWeights
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

    n, d, inter, k = 8, 128, 64, 3

    def experts(marked: bool, device) -> ExpertWeights:
        g = torch.Generator().manual_seed(7)
        ws = []
        for o, i in [(inter, d)] * (2 * n) + [(d, inter)] * n:
            q = quantize_fp4_e2m1(torch.randn(o, i, generator=g) * i**-0.5)
            ws.append(type(q)(q.data.to(device), q.scale.to(device), q.format, q.shape, 32 if marked else 0))
        return ExpertWeights(ws[:n], ws[n : 2 * n], ws[2 * n :], list(range(n)))

    x = torch.randn(tokens, d, generator=gen)
    ids = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=gen) + 0.1
    want = reference_op("moe").experts(x, ids, w, experts(True, "cpu"), 2.0)
    plain = reference_op("moe").experts(x, ids, w, experts(False, "cpu"), 2.0)
    dv = [t.to(DEVICE) for t in (x, ids, w)]
    got = CudaMoEOps().experts(*dv, experts(True, DEVICE), 2.0).cpu()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (got - plain).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_codes_and_scale_bytes_equal_the_core_quantiser(gen, dtype):
    """What MX GEMMs read: the e4m3 bit patterns (a negative value that rounds to zero is -0, 0x80, as torch
    packs it) and the ue8m0 biased exponents, byte for byte ``kv_quant.quantize_fp8``."""
    from deepinfer_core.ops.kv_quant import quantize_fp8
    from deepinfer_cuda_sm100.kernels.act_quant import fp8_act_codes

    x = _hard_rows(gen, 160).to(dtype)
    codes, scales = fp8_act_codes(x.to(DEVICE))
    want_codes, want_scales = quantize_fp8(x, 32)
    assert torch.equal(codes.cpu(), want_codes.view(torch.uint8))
    assert torch.equal(scales.cpu(), want_scales.view(torch.uint8))


def _fp8_path(monkeypatch, path: str) -> None:
    """Dispatch as on SM100 (the MX MMA) or on SM90 with ``fp8_mma`` on (e4m3 MMAs, scaled partial sums)."""
    from deepinfer_cuda_sm100 import dispatch, settings

    monkeypatch.setattr(dispatch, "arch", lambda: "sm100" if path == "sm100_mx" else "sm90")
    if path == "sm90_fp8":
        settings.use(settings.CudaSM100Settings(fp8_mma=True))


@pytest.mark.parametrize("path", ["sm100_mx", "sm90_fp8"])
@pytest.mark.parametrize("fmt", ["fp8_block32", "fp4_e2m1"])
@pytest.mark.parametrize("rows, n, k", [(130, 96, 256), (128, 200, 160)])
def test_the_mx_gemm_equals_the_reference_linear(gen, monkeypatch, fmt, rows, n, k, path):
    """The GEMM over FP8 activation codes, forced on under the interpreter, through the plugin's ``linear``:
    SM100's block-scaled MX MMA (``tl.dot_scaled``, e4m3 activations x e4m3 / e2m1 weights, ue8m0 per 32) and
    SM90's e4m3 MMA per scale block (FP4 weights widened to e4m3 in registers); equal to the reference's linear of
    the marked weight (round-tripped activations times dequantised weights), with ragged M, N and K tiles."""
    from deepinfer_cuda_sm100.kernels import mx_gemm
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    ran = []
    real = mx_gemm.mx_gemm
    _fp8_path(monkeypatch, path)
    monkeypatch.setattr(mx_gemm, "mx_gemm", lambda *a, **k: ran.append(1) or real(*a, **k))
    w = torch.randn(n, k, generator=gen) * k**-0.5
    q = quantize_fp8_block(w, "ue8m0", 32) if fmt == "fp8_block32" else quantize_fp4_e2m1(w)
    x = torch.randn(rows, k, generator=gen)
    want = reference_op("dense").linear(x, _marked(q))
    q_dev = type(q)(q.data.to(DEVICE), q.scale.to(DEVICE), q.format, q.shape, 32)
    got = CudaDenseOps().linear(x.to(DEVICE), q_dev).cpu()
    assert ran, "the MX GEMM did not run"
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_fp8_gemm_is_only_for_prefill_rows_and_mx_shaped_weights(monkeypatch):
    from deepinfer_core.ops.quant_formats import quantize_fp8_block as q8
    from deepinfer_cuda_sm100 import dispatch, settings
    from deepinfer_cuda_sm100.kernels.mx_gemm import mx_table

    assert dispatch.mx_gemm_config(256, 32) is None  # the interpreter keeps the W8A16 kernels
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    assert dispatch.mx_gemm_config(256, 32) is None  # SM90's FP8 MMA path is off until measured
    settings.use(settings.CudaSM100Settings(fp8_mma=True))
    assert dispatch.mx_gemm_config(256, 32).mma == "fp8"
    settings.use(settings.CudaSM100Settings())
    monkeypatch.setattr(dispatch, "arch", lambda: "sm100")
    assert dispatch.mx_gemm_config(256, 32).block_m == 128 and dispatch.mx_gemm_config(256, 32).mma == "mx"
    assert dispatch.mx_gemm_config(dispatch.MX_MIN_ROWS - 1, 32) is None  # decode rows: the GEMV
    assert dispatch.mx_gemm_config(256, 0) is None  # activations not quantised
    settings.use(settings.CudaSM100Settings(mx_gemm=False))
    assert dispatch.mx_gemm_config(256, 32) is None
    w, cpu = torch.randn(64, 96), torch.device("cpu")
    assert mx_table([q8(w, None, 32)], cpu) is None  # scales not powers of two: not MX
    assert mx_table([q8(w, "ue8m0")], cpu) is None  # 128 x 128 blocks: V4's format
    m = mx_table([q8(w, "ue8m0", 32)], cpu)
    codes, scales, fmt = m.keep[0]
    assert fmt == m.fmt == "e4m3" and scales.shape == (64, 3) and scales.dtype == torch.uint8
    assert torch.equal(scales[31], scales[0]) and m.ptrs.tolist() == [codes.data_ptr()]


@pytest.mark.parametrize("path", ["sm100_mx", "sm90_fp8"])
@pytest.mark.parametrize("local", [None, [0, 2, 3, 5, 6]], ids=["all_experts", "expert_parallel_subset"])
def test_routed_experts_on_the_mx_gemm_equal_the_reference(gen, monkeypatch, local, path):
    """SM100's routed experts with the release's FP8 activations (forced on under the interpreter): the gate / up
    projection with the SwiGLU epilogue and the down projection on the MX GEMM, the activations gathered and the
    outputs scattered by the tile schedule, the routing weight in the down projection's quantised input; against
    the reference's ``experts`` with the same marked FP4 weights (rows of experts held elsewhere contribute 0)."""
    from deepinfer_core.ops.weights import ExpertWeights
    from deepinfer_cuda_sm100.kernels import mx_gemm
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

    n, d, inter, k, tokens = 8, 128, 64, 3, 50
    g = torch.Generator().manual_seed(3)
    ws = []
    for o, i in [(inter, d)] * (2 * n) + [(d, inter)] * n:
        q = quantize_fp4_e2m1(torch.randn(o, i, generator=g) * i**-0.5)
        q.act_block = 32
        ws.append(q)
    held = list(range(n)) if local is None else local
    pick = [[ws[j * n + e] for e in held] for j in range(3)]
    experts = ExpertWeights(*pick, held)
    x = torch.randn(tokens, d, generator=gen)
    ids = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=gen) + 0.1
    want = reference_op("moe").experts(x, ids, w, experts, 2.0)
    ran = []
    real = mx_gemm.mx_gemm
    _fp8_path(monkeypatch, path)
    monkeypatch.setattr(
        mx_gemm, "mx_gemm", lambda *a, **kw: ran.append(kw.get("gate") is not None) or real(*a, **kw)
    )
    dv = [t.to(DEVICE) for t in (x, ids, w)]
    from deepinfer_core.testing.kit import to_device

    got = CudaMoEOps().experts(*dv, to_device(experts, DEVICE), 2.0).cpu()
    assert ran == [True, False], "the gated up projection and the down projection ran on the MX GEMM"
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_experts_cache_does_not_keep_marked_experts_alive():
    """The prepared tables of a set of experts (the MX tables built lazily among them) live only as long as the
    ``ExpertWeights`` they are keyed by: a model that is dropped frees its experts."""
    import gc
    import weakref

    from deepinfer_core.ops.weights import ExpertWeights
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

    ops, ws = CudaMoEOps(), []
    for o, i in [(64, 128)] * 4 + [(128, 64)] * 2:
        q = quantize_fp4_e2m1(torch.randn(o, i))
        ws.append(type(q)(q.data.to(DEVICE), q.scale.to(DEVICE), q.format, q.shape, 32))
    experts = ExpertWeights(ws[0:2], ws[2:4], ws[4:6], [0, 1])
    ops.experts(torch.randn(3, 128, device=DEVICE), torch.tensor([[0, 1]] * 3, device=DEVICE),
                torch.rand(3, 2, device=DEVICE), experts, 0.0)  # fmt: skip
    assert len(ops._prepared._entries) == 1
    alive = weakref.ref(experts)
    del experts, ws
    gc.collect()
    assert alive() is None and not ops._prepared._entries
