"""Prefill's quantized dense GEMMs on dequantised weights (``gg.dequantize`` then torch's GEMM,
``dispatch.dequant_gemm``) against the reference ops, on random weights."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.reference.dense import dense_weight
from deepinfer_core.testing.kit import to_device

from .cuda_sm100_helpers import BOUND, DEVICE, dev, needs_triton, rand, rel_err

pytestmark = needs_triton
REF = reference_op("dense")


def _weight(gen, fmt: str, n: int, k: int, scale_fmt=None):
    w = rand(gen, n, k, scale=0.1)
    if fmt == "fp8_block":
        return quantize_fp8_block(w, scale_fmt)
    if fmt == "fp8_block32":
        return quantize_fp8_block(w, scale_fmt, block=32)
    return quantize_fp4_e2m1(w)


@pytest.fixture
def dequant_from(monkeypatch):
    """``dispatch.dequant_gemm`` from ``rows`` rows on."""
    from deepinfer_cuda_sm100 import settings

    def set_rows(rows: int) -> None:
        settings.use(settings.CudaSM100Settings(dequant_gemm_rows=rows))

    return set_rows


@pytest.mark.parametrize(
    "fmt,scale_fmt", [("fp8_block", None), ("fp8_block", "ue8m0"), ("fp8_block32", None), ("fp4_e2m1", None)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_gives_the_reference_weight_bit_for_bit(gen, fmt, scale_fmt, dtype):
    """Each expert of a table, a subset of them in any order, against the reference's dequantised matrix (its
    float32 product rounded once to ``dtype``): the same bits. 200 x 192 leaves partial tiles on both axes."""
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

    ws = [to_device(_weight(gen, fmt, 200, 192, scale_fmt), DEVICE) for _ in range(3)]
    table = gg.WeightTable.build(ws, DEVICE)
    got = gg.dequantize(table, dtype)
    for i, w in enumerate(ws):
        assert torch.equal(got[i].cpu(), dense_weight(to_device(w, "cpu"), dtype))
    picked = gg.dequantize(table, dtype, torch.tensor([2, 0], dtype=torch.int32, device=DEVICE))
    assert torch.equal(picked.cpu(), got[[2, 0]].cpu())


@pytest.mark.parametrize("fmt", ["fp8_block", "fp8_block32", "fp4_e2m1"])
def test_linear_on_the_dequantised_weight_matches_reference(gen, fmt, dequant_from, monkeypatch):
    """From the threshold on, ``linear`` runs on the dequantised weight and never launches the tensor-core
    kernel; below it the kernel runs. Both match the reference."""
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    ops = CudaDenseOps()
    w = _weight(gen, fmt, 160, 256)
    x = rand(gen, 40, 256, dtype=torch.bfloat16)
    launched = []
    real = gg.grouped_gemm
    monkeypatch.setattr(gg, "grouped_gemm", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    ref = REF.linear(x, w)
    dequant_from(40)
    got = ops.linear(dev(x), to_device(w, DEVICE))
    assert not launched
    assert rel_err(got, ref) < BOUND[torch.bfloat16]
    dequant_from(41)
    kernel = ops.linear(dev(x), to_device(w, DEVICE))
    assert launched
    assert rel_err(kernel, ref) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("fmt", ["fp8_block", "fp4_e2m1"])
@pytest.mark.parametrize("with_add", [False, True])
def test_swiglu_mlp_on_dequantised_weights_matches_reference(gen, fmt, with_add, dequant_from, monkeypatch):
    """The shared expert at prefill sizes: gate and up in one GEMM, the clamped SwiGLU, the down projection and
    the routed experts' output added, against the reference MLP (plus ``add``); no tensor-core kernel launched."""
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    monkeypatch.setattr(gg, "grouped_gemm", None)

    ops = CudaDenseOps()
    D, inter, T = 128, 96, 24
    w1, w3, w2 = _weight(gen, fmt, inter, D), _weight(gen, fmt, inter, D), _weight(gen, fmt, D, inter)
    x = rand(gen, T, D, dtype=torch.bfloat16)
    add = rand(gen, T, D, dtype=torch.bfloat16, scale=0.05)
    ref = REF.swiglu_mlp(x, w1, w3, w2, 0.3)
    dequant_from(T)
    wd = [to_device(w, DEVICE) for w in (w1, w3, w2)]
    if with_add:
        got = ops.swiglu_mlp_add(dev(x), *wd, 0.3, dev(add))
        ref = ref + add
    else:
        got = ops.swiglu_mlp(dev(x), *wd, 0.3)
    assert rel_err(got, ref) < BOUND[torch.bfloat16]
