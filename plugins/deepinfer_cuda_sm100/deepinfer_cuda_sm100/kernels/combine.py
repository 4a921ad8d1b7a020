"""The MoE combine: each token's ``k`` weighted expert rows (float32) summed in a fixed order and cast, in one
launch (the torch sum and cast were two)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter


@triton.jit
def _combine_kernel(y_ptr, out_ptr, K, D, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``(t, d-block)``: ``out[t] = sum_j y[t * K + j]`` over ``j = 0 .. K-1`` in order."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(0, K):
        acc += tl.load(y_ptr + (t * K + j) * D + d, mask=dm, other=0.0)
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=dm)


def combine(y: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """``y [T * k, D]`` float32 (contiguous) -> ``[T, D]`` in ``dtype``: ``y.view(T, k, D).sum(1).to(dtype)``."""
    D = y.shape[1]
    T = y.shape[0] // k
    out = torch.empty((T, D), dtype=dtype, device=y.device)
    if T == 0:
        return out
    bd = min(1024, triton.next_power_of_2(D))
    _combine_kernel[(T, triton.cdiv(D, bd))](y, out, k, D, BLOCK_D=bd, num_warps=4, **dispatch.pdl_args(T))
    return out
