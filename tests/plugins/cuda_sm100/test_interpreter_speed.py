"""``tests/interpreter_speed.py``: the interpreter with fewer language patches computes the same bits."""

from __future__ import annotations

import pytest
import torch

from tests import interpreter_speed

from .cuda_sm100_helpers import INTERPRETED, needs_triton, rand

pytestmark = [needs_triton, pytest.mark.skipif(not INTERPRETED, reason="the interpreter only")]


def _kernels(gen: torch.Generator) -> list[torch.Tensor]:
    """Three kernels full of nested ``@triton.jit`` calls (``tl.sum``, ``tl.cumsum``, ``tl.sigmoid``, the
    plugin's helpers): V4.1's site coefficients with their Sinkhorn, the sampler's sort-free ``probs``, and the
    index queries' RoPE and FP4 round trip."""
    from deepinfer_core.models.deepseek_v41.kv_formats import index_keys
    from deepinfer_cuda_sm100.kernels import kv_store, mhc, probs

    T, N, D = 5, 4, 16
    x, fn = rand(gen, T, N, D), rand(gen, N * N + 2 * N, N * D, scale=0.1)
    out = list(mhc.hc_mixes(x, fn, rand(gen, N * N + 2 * N), torch.rand(3, generator=gen), 20, 1e-6, 1e-6))
    logits = rand(gen, 2, 1000, scale=3.0)
    out.append(probs.probs(logits, torch.tensor([0.6, 1.0]), torch.tensor([0, 50]), torch.tensor([0.95, 0.5]),
                           torch.tensor([0.0, 0.05])))  # fmt: skip
    q, w = rand(gen, 4, 2, 64), rand(gen, 4, 2)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
    out.extend(
        kv_store.index_query(q, w, 0.5, torch.tensor([0, 3, 9, 17]), inv_freq, index_keys(64, torch.float32))
    )
    return out


def test_the_kernels_give_the_same_bits_with_and_without_the_repeated_patches():
    """The same kernels and inputs under Triton's own interpreter and under :mod:`tests.interpreter_speed` (no
    repeated language patches, no overflow sanitizing, remembered numpy types, block types and tensor shapes): equal bytes, with a fifth of the
    full ``_patch_lang`` runs or fewer. After every launch the language is Triton's
    again (``tl.sum`` is its ``@triton.jit`` function, not the interpreter's patch)."""
    import triton.language as tl
    from triton.runtime import interpreter

    was_installed = interpreter_speed.uninstall()
    real_sum, real_patch = tl.sum, interpreter._patch_lang
    real_np_dtype, real_options = interpreter._get_np_dtype, interpreter.interpreter_builder.options
    real_inits = tl.core.block_type.__init__, tl.core.tensor.__init__
    assert real_options.sanitize_overflow and not real_options.debug  # what install() relies on
    runs = [0]

    def counted(fn):
        runs[0] += 1
        return real_patch(fn)

    interpreter._patch_lang = counted
    try:
        plain, plain_runs = _kernels(torch.Generator().manual_seed(11)), runs[0]
        assert tl.sum is real_sum
        runs[0] = 0
        assert interpreter_speed.install()  # over the counting one
        assert not interpreter.interpreter_builder.options.sanitize_overflow
        assert interpreter._get_np_dtype is not real_np_dtype
        assert (tl.core.block_type.__init__, tl.core.tensor.__init__) != real_inits
        sped, sped_runs = _kernels(torch.Generator().manual_seed(11)), runs[0]
        assert tl.sum is real_sum
    finally:
        interpreter_speed.uninstall()
        assert interpreter._get_np_dtype is real_np_dtype
        assert interpreter.interpreter_builder.options is real_options
        assert (tl.core.block_type.__init__, tl.core.tensor.__init__) == real_inits
        interpreter._patch_lang = real_patch
        if was_installed:
            interpreter_speed.install()
    for a, b in zip(plain, sped, strict=True):
        assert torch.equal(a, b)
    assert 0 < sped_runs <= plain_runs / 5, (sped_runs, plain_runs)
