"""Conformance cases for the dense ops (tiny CPU float32 inputs, deterministic from the generator)."""

from __future__ import annotations

import torch

from deepinfer_core.ops.act_quant import FP8_ACT_BLOCK
from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.testing.opcase import OpCase


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=g) * scale


def inv_freq(dim: int = 8, theta: float = 10000.0) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)


def _linear(quant: str | None, out_f: int = 48, in_f: int = 64):
    def make(g):
        w = randn(g, out_f, in_f, scale=in_f**-0.5)
        if quant == "fp8":
            w = quantize_fp8_block(w)
        elif quant == "fp8_ue8m0":
            w = quantize_fp8_block(w, "ue8m0")
        elif quant == "fp4":
            w = quantize_fp4_e2m1(w)
        elif quant == "fp8_32_act":  # V4.1 with the release's FP8 GEMM inputs
            w = quantize_fp8_block(w, "ue8m0", 32)
            w.act_block = FP8_ACT_BLOCK
        elif quant == "fp4_act":
            w = quantize_fp4_e2m1(w)
            w.act_block = FP8_ACT_BLOCK
        return (randn(g, 5, in_f), w), {}

    return make


def _grouped_linear(quant: str | None):
    """Three groups, each its own weight (V4's output projection), five token rows."""

    def make(g):
        ws = [_linear(quant, 40, 64)(g)[0][1] for _ in range(3)]
        return (randn(g, 5, 3, 64), ws), {}

    return make


def _rms(weighted: bool):
    return lambda g: (
        (randn(g, 5, 3, 32, scale=3.0), randn(g, 32).abs() + 0.5 if weighted else None, 1e-6),
        {},
    )


def _rope(inverse: bool):
    def make(g):
        pos = torch.randint(0, 5000, (6,), generator=g)
        return (randn(g, 6, 4, 32), pos, inv_freq(8)), {"inverse": inverse}

    return make


def _hc_pre(g):
    n, d = 4, 16
    x, fn = randn(g, 5, n, d), randn(g, (2 + n) * n, n * d, scale=0.05)
    hc = HCParams(fn, randn(g, (2 + n) * n, scale=0.3), randn(g, 3, scale=0.1) + 1, 20, 1e-6, 1e-6)
    return (x, hc), {}


def _hc_post(g):
    n, d = 4, 16
    comb = torch.softmax(randn(g, 5, n, n), dim=-1)
    return (randn(g, 5, d), randn(g, 5, n, d), torch.sigmoid(randn(g, 5, n)) * 2, comb), {}


def _hc_head(g):
    n, d = 4, 16
    x = randn(g, 5, n, d)
    return (
        x,
        HCParams(
            randn(g, n, n * d, scale=0.05), randn(g, n, scale=0.3), randn(g, 1, scale=0.1) + 1, 0, 1e-6, 1e-6
        ),
    ), {}


def needs_activation_quant(backends) -> str | None:
    """Why an ``*_act`` case does not apply: the platform does not declare ``activation_quant`` (plugin API 2.2)."""
    if getattr(backends.dense, "activation_quant", False) and getattr(
        backends.moe, "activation_quant", False
    ):
        return None
    return "the platform does not declare DenseOps / MoEOps.activation_quant (activation_quant='fp8')"


def _swiglu(quant: bool, limit: float, act: bool = False):
    def make(g):
        ws = [randn(g, 32, 64, scale=0.3), randn(g, 32, 64, scale=0.3), randn(g, 64, 32, scale=0.2)]
        if act:  # V4.1's shared expert with the release's FP8 GEMM inputs
            ws = [quantize_fp8_block(w, "ue8m0", 32) for w in ws]
            for w in ws:
                w.act_block = FP8_ACT_BLOCK
        elif quant:
            ws = [quantize_fp8_block(w) for w in ws]
        return (randn(g, 5, 64), *ws, limit), {}

    return make


def _hc_mixes(g):
    """V4.1's coefficients of a site (no collapse), values of the size a trained model sees."""
    return _hc_pre(g)


def _hc_collapse(g):
    n, d = 4, 16
    return (randn(g, 5, n, d), torch.sigmoid(randn(g, 5, n)) + 1e-6), {}


def _engram_gate(g):
    """Four streams, one row whose dot product is tiny (the gate's ``1e-6`` floor) and one of zeros."""
    n, d = 4, 32
    h, key = randn(g, 6, n, d), randn(g, 6, n, d)
    key[1, 0] = 1e-9
    h[2] = 0.0
    return (h, key, randn(g, 6, d), randn(g, n, d), 1e-20), {}


def _engram_hashes(g):
    """Seven tokens' 4-gram histories in a look-back pool of 12 ids: a history cut by the sequence's start
    (``-1`` slots), one with a dead id (``-1`` in the pool: an image position) that blocks the older ones; two
    Engram layers of 3 heads, V4.1-sized multipliers (products near ``2**63``) and primes."""
    from deepinfer_core.models.deepseek_v41.config import EngramConfig
    from deepinfer_core.models.deepseek_v41.engram import bucket_primes, multipliers

    e = EngramConfig(layer_ids=(0, 3), num_embeddings=(0, 0), max_ngram_size=4, vocab_size=40, n_heads=3,
                     head_dim=16, pad_id=2, compressed_vocab_size=500)  # fmt: skip
    ids = torch.randint(0, 500, (12, 1), generator=g)
    ids[5] = -1
    slots = torch.randint(0, 12, (7, 4), generator=g)
    slots[0, 2:] = -1
    slots[1, 1] = 5
    primes = torch.tensor(bucket_primes(e))
    sizes = primes.flatten(1)
    offsets = torch.cumsum(sizes, 1) - sizes
    return (ids, slots, 2, multipliers(e), primes, offsets), {}


CASES = [
    OpCase("dense", "linear", "plain", _linear(None), atol=1e-4, rtol=1e-4),
    OpCase("dense", "linear", "fp8_block_ragged", _linear("fp8", 200, 160), atol=1e-4, rtol=1e-4),
    OpCase("dense", "linear", "fp8_block_ue8m0", _linear("fp8_ue8m0"), atol=1e-4, rtol=1e-4),
    OpCase("dense", "linear", "fp4_e2m1", _linear("fp4"), atol=1e-4, rtol=1e-4),
    OpCase(
        "dense",
        "linear",
        "fp8_block32_act",
        _linear("fp8_32_act", 96, 160),
        atol=1e-4,
        rtol=1e-4,
        requires=needs_activation_quant,
    ),
    OpCase(
        "dense",
        "linear",
        "fp4_e2m1_act",
        _linear("fp4_act"),
        atol=1e-4,
        rtol=1e-4,
        requires=needs_activation_quant,
    ),
    OpCase("dense", "grouped_linear", "fp8_block", _grouped_linear("fp8"), atol=1e-4, rtol=1e-4),
    OpCase("dense", "grouped_linear", "plain", _grouped_linear(None), atol=1e-4, rtol=1e-4),
    OpCase("dense", "rms_norm", "weighted", _rms(True)),
    OpCase("dense", "rms_norm", "unweighted", _rms(False)),
    OpCase("dense", "rope", "forward", _rope(False), atol=1e-5, rtol=1e-4),
    OpCase("dense", "rope", "inverse", _rope(True), atol=1e-5, rtol=1e-4),
    OpCase("dense", "hc_pre", "hc4_sinkhorn20", _hc_pre, atol=1e-5, rtol=1e-4),
    OpCase("dense", "hc_post", "hc4", _hc_post),
    OpCase("dense", "hc_head", "hc4", _hc_head),
    OpCase("dense", "hc_mixes", "hc4_sinkhorn20", _hc_mixes, atol=1e-5, rtol=1e-4),
    OpCase("dense", "hc_collapse", "hc4", _hc_collapse),
    OpCase("dense", "engram_gate", "hc4_tiny_and_zero_rows", _engram_gate, atol=1e-5, rtol=1e-4),
    OpCase("dense", "engram_hashes", "two_layers_start_and_dead_ids", _engram_hashes, atol=0.0, rtol=0.0),
    OpCase("dense", "swiglu_mlp", "clamped", _swiglu(False, 1.5), atol=1e-4, rtol=1e-4),
    OpCase("dense", "swiglu_mlp", "unclamped", _swiglu(False, 0.0), atol=1e-4, rtol=1e-4),
    OpCase("dense", "swiglu_mlp", "fp8_clamped", _swiglu(True, 1.5), atol=1e-4, rtol=1e-4),
    OpCase(
        "dense",
        "swiglu_mlp",
        "fp8_block32_act",
        _swiglu(True, 1.5, act=True),
        atol=1e-4,
        rtol=1e-4,
        requires=needs_activation_quant,
    ),
]
