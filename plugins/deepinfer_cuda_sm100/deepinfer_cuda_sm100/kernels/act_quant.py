"""DeepSeek-V4.1's activation quantiser as a round trip: the input of an FP8 / FP4 GEMM through FP8 e4m3 with one
ue8m0 scale per 32 values and back, in one launch (``deepinfer_core.ops.act_quant``, the release's numerics:
``activation_quant="fp8"``).

Bit for bit ``fp8_act_roundtrip`` of the core: ``amax`` over the block clamped to ``>= 1e-4``, ``s = 2**ceil(log2(
amax * fp32(1/448)))`` from the product's bits, ``e4m3(clamp(x / s, +-448)) * s`` rounded to nearest even. The
values come back in the activation dtype (exact in bf16: an e4m3 value times a power of two), so the existing
GEMMs multiply them unchanged. With ``row_w`` (a routed expert's down projection) each row is first scaled by
its routing weight and rounded to the activation dtype, as the release computes ``w2((weights * x).to(dtype))``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import bf16_grid, e4m3_grid, pdl_enter, pow2, pow2_ceil


@triton.jit
def _act_quant_kernel(x_ptr, w_ptr, out_ptr, scale_ptr, stride_x, stride_o, NG, B: tl.constexpr, G: tl.constexpr,
                      HAS_W: tl.constexpr, CODES: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Row ``program_id(0)``, scale blocks ``[program_id(1) * G, + G)`` of ``B`` values each (``NG`` in a row).
    ``CODES``: write the e4m3 codes (bytes) to ``out`` and the ue8m0 scale bytes to ``scale [rows, NG]``; else the
    round-tripped values to ``out``."""
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * G + tl.arange(0, G)
    col = g[:, None] * B + tl.arange(0, B)[None, :]
    m = g[:, None] < NG
    x = tl.load(x_ptr + r * stride_x + col, mask=m, other=0.0).to(tl.float32)
    if HAS_W:
        x = x * tl.load(w_ptr + r)
        if x_ptr.dtype.element_ty == tl.bfloat16:  # to bf16, nearest even, by bits
            x = bf16_grid(x)
        else:
            x = x.to(x_ptr.dtype.element_ty).to(tl.float32)
    s, e = pow2_ceil(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4) * (1.0 / 448.0))
    inv = ((254 - e) << 23).to(tl.float32, bitcast=True)  # 1 / s, exact
    y = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
    q = e4m3_grid(y)
    if CODES:
        code = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)  # exact: q is on the e4m3 grid
        code = tl.where(
            (q == 0.0) & (y.to(tl.int32, bitcast=True) < 0), tl.full(code.shape, 0x80, tl.uint8), code
        )
        tl.store(out_ptr + r * stride_o + col, code, mask=m)
        tl.store(scale_ptr + r * NG + g, e.to(tl.uint8), mask=g < NG)
    else:
        tl.store(out_ptr + r * stride_o + col, (q * s[:, None]).to(out_ptr.dtype.element_ty), mask=m)


def _launch(x: torch.Tensor, block: int, row_w: torch.Tensor | None, codes: bool):
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"activation quantisation needs the last dimension ({k}) a multiple of {block}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows, ng = x2.shape[0], k // block
    out = torch.empty((rows, k), dtype=torch.uint8 if codes else x.dtype, device=x.device)
    scale = torch.empty((rows, ng), dtype=torch.uint8, device=x.device) if codes else out
    if rows == 0:
        return out, scale
    g = min(pow2(ng), max(1, 1024 // block))
    w = row_w.reshape(-1).float().contiguous() if row_w is not None else out
    _act_quant_kernel[(rows, triton.cdiv(ng, g))](
        x2, w, out, scale, x2.stride(0), out.stride(0), ng, B=block, G=g, HAS_W=row_w is not None, CODES=codes,
        num_warps=4 if g * block >= 1024 else 1, **dispatch.pdl_args(rows),
    )  # fmt: skip
    return out, scale


def fp8_act_roundtrip(x: torch.Tensor, block: int = 32, row_w: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K]`` (``K % block == 0``) through FP8 with one ue8m0 scale per ``block`` values and back, in
    ``x.dtype``; ``row_w`` (float32, one per row of ``x`` flattened to 2-D) scales each row first."""
    return _launch(x, block, row_w, codes=False)[0].view(x.shape)


def fp8_act_codes(
    x: torch.Tensor, block: int = 32, row_w: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, K]`` -> ``(codes uint8 [T, K], ue8m0 scale bytes uint8 [T, K / block])``: the same quantiser (and
    ``row_w``), its e4m3 bit patterns and biased exponents, as MX GEMMs read them (``kernels/mx_gemm.py``)."""
    return _launch(x, block, row_w, codes=True)
