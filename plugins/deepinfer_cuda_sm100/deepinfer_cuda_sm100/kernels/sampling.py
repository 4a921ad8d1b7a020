"""Element-wise logits passes over ``[B, V]``: vLLM-semantics penalties and the grammar bitmask.

Each reads the logits once and writes them once (the torch versions of the same expressions make
4-6 passes and materialise ``[B, V]`` temporaries). Grid ``(B, cdiv(V, BLOCK_V))``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter


@triton.jit
def _penalties_kernel(logits_ptr, mask_ptr, counts_ptr, pres_ptr, freq_ptr, rep_ptr, out_ptr, V,
                      stride_l, stride_m, stride_c, stride_o, BLOCK_V: tl.constexpr,
                      PDL: tl.constexpr = False):  # fmt: skip
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    vm = v < V
    x = tl.load(logits_ptr + b * stride_l + v, mask=vm, other=0.0).to(tl.float32)
    in_prompt = tl.load(mask_ptr + b * stride_m + v, mask=vm, other=0) != 0
    cnt = tl.load(counts_ptr + b * stride_c + v, mask=vm, other=0).to(tl.float32)
    rep = tl.load(rep_ptr + b)
    seen = in_prompt | (cnt > 0)
    x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
    x = x - tl.load(freq_ptr + b) * cnt - tl.load(pres_ptr + b) * (cnt > 0).to(tl.float32)
    tl.store(out_ptr + b * stride_o + v, x, mask=vm)


def apply_penalties(logits, prompt_mask, output_counts, presence, frequency, repetition) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.sampling.SamplingOps.apply_penalties`."""
    B, V = logits.shape
    out = torch.empty((B, V), dtype=torch.float32, device=logits.device)
    if B == 0:
        return out
    logits = logits.contiguous()
    mask = (
        prompt_mask.contiguous().view(torch.uint8)
        if prompt_mask.dtype == torch.bool
        else prompt_mask.contiguous()
    )
    counts = output_counts.contiguous()
    cfg = dispatch.vocab_config(V)
    _penalties_kernel[(B, triton.cdiv(V, cfg.block_v))](
        logits, mask, counts, presence.float().contiguous(), frequency.float().contiguous(),
        repetition.float().contiguous(), out, V, logits.stride(0), mask.stride(0), counts.stride(0), out.stride(0),
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps, **dispatch.pdl_args(B),
    )  # fmt: skip
    return out


@triton.jit
def _bitmask_kernel(
    logits_ptr, mask_ptr, out_ptr, V, stride_l, stride_m, stride_o, BLOCK_V: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    vm = v < V
    x = tl.load(logits_ptr + b * stride_l + v, mask=vm, other=0.0)
    word = tl.load(mask_ptr + b * stride_m + v // 32, mask=vm, other=0)
    allowed = ((word >> (v % 32)) & 1) != 0
    tl.store(out_ptr + b * stride_o + v, tl.where(allowed, x, float("-inf")), mask=vm)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """See :meth:`deepinfer_core.ops.sampling.SamplingOps.apply_bitmask`."""
    B, V = logits.shape
    out = torch.empty_like(logits, memory_format=torch.contiguous_format)
    if B == 0:
        return out
    logits, bitmask = logits.contiguous(), bitmask.contiguous()
    cfg = dispatch.vocab_config(V)
    _bitmask_kernel[(B, triton.cdiv(V, cfg.block_v))](
        logits, bitmask, out, V, logits.stride(0), bitmask.stride(0), out.stride(0),
        BLOCK_V=cfg.block_v, num_warps=cfg.num_warps, **dispatch.pdl_args(B),
    )  # fmt: skip
    return out
