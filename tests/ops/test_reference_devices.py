"""The reference ops allocate their results on the inputs' device, not on the CPU.

They are the fallback for every concern a plugin leaves unserved, so they run on CUDA and NPU tensors
too. The ``meta`` device stands in for an accelerator here: it has shapes and dtypes but no data, so
an op that builds its output on the CPU and copies rows into it fails on it, as it would on a GPU."""

from __future__ import annotations

import torch

from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.reference.attention import ReferenceAttentionOps
from deepinfer_core.ops.reference.dense import ReferenceDenseOps

META = torch.device("meta")


def test_compress_result_on_input_device():
    kv, score = torch.empty(3, 4, 8, device=META), torch.empty(3, 4, 8, device=META)
    pos = torch.empty(3, dtype=torch.int64, device=META)
    out = ReferenceAttentionOps().compress(
        kv, score, torch.empty(8, device=META), 1e-6, pos, torch.empty(2, device=META)
    )
    assert out.device == META and out.shape == (3, 8)


def test_linear_result_on_input_device():
    out = ReferenceDenseOps().linear(torch.empty(2, 4, device=META), torch.empty(5, 4, device=META))
    assert out.device == META and out.shape == (2, 5)


def test_hc_pre_of_no_tokens_on_input_device():
    x = torch.empty(0, 4, 8, device=META)
    hc = HCParams(torch.empty(24, 32, device=META), torch.empty(24, device=META), torch.empty(3, device=META), 20,
                  1e-6, 1e-6)  # fmt: skip
    out, post, comb = ReferenceDenseOps().hc_pre(x, hc)
    assert {out.device, post.device, comb.device} == {META}
    assert post.dtype == comb.dtype == torch.float32
