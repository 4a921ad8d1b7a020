"""Contract tests of the ascend950 dense ops: the plugin's op code runs on the CPU against the torch_npu
stand-in and is compared with the reference ops on random inputs. This checks the plugin's layouts,
plumbing and math against the operators' documented semantics, not the Ascend kernels."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block

BF16 = dict(atol=2e-2, rtol=2e-2)


def inv_freq(rd: int) -> torch.Tensor:
    return 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd))


def hc_params(n: int, d: int, g: torch.Generator):
    fn = torch.randn((2 + n) * n, n * d, generator=g) * 0.1
    return fn, torch.randn((2 + n) * n, generator=g) * 0.1, torch.rand(3, generator=g) + 0.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_through_npu_rms_norm_matches_reference(ascend, ref, all_fused, gen, dtype, weighted):
    x = torch.randn(7, 3, 96, generator=gen).to(dtype) * 3
    w = torch.rand(96, generator=gen) + 0.5 if weighted else None
    torch.testing.assert_close(ascend.dense.rms_norm(x, w, 1e-6), ref.dense.rms_norm(x, w, 1e-6))
    assert all_fused.calls["npu_rms_norm"] == 1


@pytest.mark.parametrize("inverse", [False, True])
def test_rope_interleaved_pairs_on_trailing_dims_match_reference(ascend, ref, all_fused, gen, inverse):
    x = torch.randn(9, 4, 80, generator=gen).bfloat16()
    pos = torch.randint(0, 4096, (9,), generator=gen)
    out = ascend.dense.rope(x, pos, inv_freq(16), inverse)
    torch.testing.assert_close(out, ref.dense.rope(x, pos, inv_freq(16), inverse))
    assert torch.equal(out[..., :64], x[..., :64]), "nope channels must pass through"
    assert all_fused.calls["npu_rotary_mul"] == 1


def test_rope_then_inverse_rope_is_identity(ascend, gen):
    x = torch.randn(5, 2, 32, generator=gen)
    pos = torch.randint(0, 100, (5,), generator=gen)
    back = ascend.dense.rope(ascend.dense.rope(x, pos, inv_freq(8)), pos, inv_freq(8), inverse=True)
    torch.testing.assert_close(back, x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [4, 8])
def test_hc_pre_through_mhc_pre_and_sinkhorn_matches_reference(ascend, ref, all_fused, gen, n):
    x = torch.randn(6, n, 32, generator=gen).bfloat16()
    fn, base, scale = hc_params(n, 32, gen)
    got = ascend.dense.hc_pre(x, HCParams(fn, base, scale, 20, 1e-6, 1e-6))
    want = ref.dense.hc_pre(x, HCParams(fn, base, scale, 20, 1e-6, 1e-6))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5) if a.dtype == torch.float32 else (
            torch.testing.assert_close(a, b, **BF16)
        )
    assert all_fused.calls["npu_mhc_pre"] == 1 and all_fused.calls["npu_mhc_sinkhorn"] == 1


def test_hc_pre_outside_the_operator_envelope_uses_torch(ascend, ref, all_fused, gen):
    """n = 3 and float32 are outside npu_mhc_pre's documented support: plain torch, same results."""
    for n, dtype in ((3, torch.bfloat16), (4, torch.float32)):
        x = torch.randn(4, n, 16, generator=gen).to(dtype)
        fn, base, scale = hc_params(n, 16, gen)
        got = ascend.dense.hc_pre(x, HCParams(fn, base, scale, 5, 1e-6, 1e-6))
        for a, b in zip(got, ref.dense.hc_pre(x, HCParams(fn, base, scale, 5, 1e-6, 1e-6))):
            torch.testing.assert_close(a, b, **BF16)
    assert all_fused.calls["npu_mhc_pre"] == 0


def test_hc_post_passes_comb_transposed_to_mhc_post(ascend, ref, all_fused, gen):
    n, d = 4, 48
    res = torch.randn(5, n, d, generator=gen).bfloat16()
    y = torch.randn(5, d, generator=gen).bfloat16()
    post = torch.rand(5, n, generator=gen) * 2
    comb = torch.rand(5, n, n, generator=gen)  # deliberately not symmetric
    torch.testing.assert_close(
        ascend.dense.hc_post(y, res, post, comb), ref.dense.hc_post(y, res, post, comb), **BF16
    )
    assert all_fused.calls["npu_mhc_post"] == 1


def test_hc_head_matches_reference(ascend, ref, gen):
    x = torch.randn(5, 4, 32, generator=gen).bfloat16()
    fn, base, scale = (
        torch.randn(4, 128, generator=gen) * 0.1,
        torch.randn(4, generator=gen),
        torch.rand(1, generator=gen),
    )
    torch.testing.assert_close(
        ascend.dense.hc_head(x, HCParams(fn, base, scale, 0, 1e-6, 1e-6)),
        ref.dense.hc_head(x, HCParams(fn, base, scale, 0, 1e-6, 1e-6)),
        **BF16,
    )


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "fp4_e2m1"])
def test_linear_and_swiglu_with_each_weight_format_match_reference(ascend, ref, gen, fmt):
    def weight(out_f: int, in_f: int):
        w = torch.randn(out_f, in_f, generator=gen) * 0.1
        return {
            "bf16": torch.Tensor.bfloat16,
            "fp8_block": quantize_fp8_block,
            "fp4_e2m1": quantize_fp4_e2m1,
        }[fmt](w)

    x = torch.randn(6, 160, generator=gen).bfloat16()
    w = weight(192, 160)
    torch.testing.assert_close(ascend.dense.linear(x, w), ref.dense.linear(x, w), **BF16)
    w1, w3, w2 = weight(64, 160), weight(64, 160), weight(160, 64)
    got = ascend.dense.swiglu_mlp(x, w1, w3, w2, 0.3)
    torch.testing.assert_close(got, ref.dense.swiglu_mlp(x, w1, w3, w2, 0.3), **BF16)


def test_hc_pre_falls_back_to_torch_if_mhc_pre_returns_an_undocumented_shape(
    ascend, ref, all_fused, monkeypatch, gen, caplog
):
    """The page prints h_post as (T, D); if the real operator did that, the plugin must notice and use torch."""
    real = all_fused.npu_mhc_pre

    def as_printed(x, *a, **kw):
        h_in, post, res, *rest = real(x, *a, **kw)
        return (h_in, post.new_zeros(x.shape[0], x.shape[-1]), res, *rest)

    monkeypatch.setattr(all_fused, "npu_mhc_pre", as_printed)
    x = torch.randn(3, 4, 32, generator=gen).bfloat16()
    fn, base, scale = hc_params(4, 32, gen)
    for _ in range(2):
        got = ascend.dense.hc_pre(x, HCParams(fn, base, scale, 3, 1e-6, 1e-6))
        for a, b in zip(got, ref.dense.hc_pre(x, HCParams(fn, base, scale, 3, 1e-6, 1e-6))):
            torch.testing.assert_close(a, b, **BF16)
    assert "npu_mhc_pre returned h_post" in caplog.text
    assert all_fused.calls["npu_mhc_sinkhorn"] == 0
    assert all_fused.calls["npu_mhc_pre"] == 1, "after the first mismatch the plugin stops calling it"


@pytest.mark.parametrize("fmt", ["fp8_block", "fp4_e2m1"])
def test_device_dequantization_equals_the_core_format_decoder(gen, fmt):
    from deepinfer_ascend950.ops.weights import dequantize
    from deepinfer_core.ops.quant_formats import dequant

    w = torch.randn(200, 288, generator=gen)
    qw = quantize_fp8_block(w) if fmt == "fp8_block" else quantize_fp4_e2m1(w)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(dequantize(qw, dtype), dequant(qw, dtype))
