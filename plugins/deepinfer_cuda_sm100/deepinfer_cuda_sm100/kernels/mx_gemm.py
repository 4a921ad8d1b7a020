"""Block-scaled MX GEMM for SM100: DeepSeek-V4.1's GEMMs with the release's FP8 activations
(``activation_quant="fp8"``) on the tensor cores' native microscaling MMA.

V4.1's formats are the OCP MX formats: activations e4m3 with one ue8m0 scale per 32 values along K (MXFP8), routed
experts e2m1 with one ue8m0 scale per 32 (MXFP4, packed two a byte, the even element in the low nibble), and the
other FP8 weights e4m3 with one ue8m0 scale per 32 x 32 block, which is MXFP8 once each row carries its block's
scale. ``tl.dot_scaled`` over those operands compiles for ``sm_100a`` to ``tcgen05.mma ... kind::mxf8f6f4
.block_scale.block32`` at 128-row tiles (checked in CI, ``tests/plugins/cuda_sm100/test_sm100_compile.py``): the
products of codes and scales accumulate in float32, as the release's float32 GEMM of the dequantised values does.
Smaller M tiles fall back to an upcast ``kind::f16`` MMA, so the dispatch uses 128-row tiles only. One kernel
serves a dense linear (one expert, a trivial schedule) and the routed experts (``gg.tile_schedule``: sorted rows,
the activations gathered by ``a_idx``, the gate and up projections in one tile with the SwiGLU epilogue, the down
projection scattered to ``c_idx``).

**Not run on SM100 hardware** (none was reachable). Tested under the interpreter, which emulates ``dot_scaled``
by upcasting to bf16 (exact for these codes times powers of two), against the reference ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepinfer_core.plugin_api import QuantizedWeight
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels import grouped_gemm as gg
from deepinfer_cuda_sm100.kernels._common import pdl_enter, swiglu

#: values per ue8m0 scale along K: the MX block
MX_BLOCK = 32


@dataclass(frozen=True)
class MXTable:
    """One projection of ``E`` experts (one for a dense linear) as the MX GEMM reads it: per expert the address of
    its ``codes`` (uint8 ``[N, K]`` e4m3, or ``[N, K / 2]`` packed e2m1) and of its ``scales`` (uint8 ``[N, K / 32]``,
    ue8m0 biased exponents, one per row and 32 values). Holds the tensors so the addresses stay valid."""

    ptrs: torch.Tensor
    scale_ptrs: torch.Tensor
    fmt: str  # "e4m3" or "e2m1"
    n: int
    k: int
    keep: tuple


def _operands(w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, str] | None:
    n, k = w.shape
    if k % MX_BLOCK or w.format not in ("fp8_block32", "fp4_e2m1"):
        return None
    (s,) = gg.ue8m0_bytes([w.scale.float()])  # unchanged (float32) unless every scale is a power of two
    if s.dtype != torch.uint8:
        return None
    if w.format == "fp8_block32":  # each row carries its 32 x 32 block's scale
        return (
            w.data.view(torch.uint8).contiguous(),
            s.repeat_interleave(MX_BLOCK, dim=0)[:n].contiguous(),
            "e4m3",
        )
    return w.data.view(torch.uint8).contiguous(), s.contiguous(), "e2m1"


def mx_table(weights: list[QuantizedWeight], device: torch.device) -> MXTable | None:
    """``weights`` (one per expert, one shape and format) as MX operands, or ``None`` where they are not MX-shaped
    (V4's 128 x 128 blocks, scales that are not powers of two, ``K`` not a multiple of 32). Checks on the host
    once, when the table is built."""
    ops = []
    for w in weights:
        if not isinstance(w, QuantizedWeight) or w.shape != weights[0].shape or w.format != weights[0].format:
            return None
        o = _operands(w)
        if o is None:
            return None
        ops.append(o)
    n, k = weights[0].shape
    ptrs = torch.tensor([c.data_ptr() for c, _, _ in ops], dtype=torch.int64, device=device)
    sptrs = torch.tensor([s.data_ptr() for _, s, _ in ops], dtype=torch.int64, device=device)
    return MXTable(ptrs, sptrs, ops[0][2], n, k, tuple(ops))


@triton.jit
def _e2m1_as_e4m3(b, R: tl.constexpr, C: tl.constexpr):
    """Packed e2m1 bytes ``[R, C]`` (element ``2i`` of a column in the low nibble of byte ``i``) -> e4m3 bytes
    ``[2 R, C]`` of the same values (exact: every e2m1 value is an e4m3 value; the sign bit moves, -0 stays -0)."""
    x = tl.join(b & 0xF, b >> 4).to(tl.int32)  # [R, C, 2]
    x = tl.reshape(tl.permute(x, (0, 2, 1)), (2 * R, C))
    c = x & 7  # magnitude code: 0, 0.5, 1, 1.5, 2, 3, 4, 6
    mag = tl.where(c >= 2, (((c >> 1) + 6) << 3) | ((c & 1) << 2), tl.where(c == 1, 0x30, 0))
    return (mag | ((x & 8) << 4)).to(tl.uint8)


@triton.jit
def _mma_step(a, sa, w, sw, acc, W_FMT: tl.constexpr, MMA: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr):  # fmt: skip
    """``acc + (a * sa) @ (w * sw)`` for one K step: ``"mx"``, the block-scaled MMA (SM100); ``"fp8"`` (SM90, one
    32-value scale block a step), an e4m3 x e4m3 MMA of the codes, its partial sums scaled by ``sa[m] * sw[n]``."""
    if MMA == "mx":
        return tl.dot_scaled(a, sa, "e4m3", w, sw, W_FMT, acc)
    else:
        if W_FMT == "e2m1":
            w = _e2m1_as_e4m3(w, BLOCK_K // 2, BLOCK_N)
        p = tl.dot(a.to(tl.float8e4nv, bitcast=True), w.to(tl.float8e4nv, bitcast=True), out_dtype=tl.float32)
        s_a = (sa.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # [M, 1]: 2**(byte - 127)
        s_w = tl.reshape((sw.to(tl.int32) << 23).to(tl.float32, bitcast=True), (1, BLOCK_N))
        return acc + p * s_a * s_w


@triton.jit
def _mx_gemm_kernel(a_ptr, sa_ptr, a_idx_ptr, w_tab, sw_tab, g_tab, sg_tab, c_ptr, c_idx_ptr, tile_ex_ptr,
                    tile_start_ptr, tile_end_ptr, N, K, stride_am, stride_cm, limit, W_FMT: tl.constexpr,
                    GATED: tl.constexpr, HAS_A_IDX: tl.constexpr, HAS_C_IDX: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MMA: tl.constexpr = "mx",
                    PDL: tl.constexpr = False):  # fmt: skip
    """Tile ``program_id(0)`` of a grouped problem (``gg.tile_schedule``: sorted rows of one expert), columns
    ``program_id(1)``: ``c[rows] = (a[a_idx[rows]] * sa) @ (w[ex] * sw).T``, e4m3 activation codes with ue8m0
    bytes per 32 against the expert's e4m3 or packed e2m1 codes and bytes, float32 accumulation. ``GATED``: the
    up table is ``w``, the gate table ``g``, and the tile stores ``swiglu(gate, up, limit)``."""
    pdl_enter(PDL)
    tile = tl.program_id(0)
    ex = tl.load(tile_ex_ptr + tile)
    if ex >= 0:
        PK: tl.constexpr = 2 if W_FMT == "e2m1" else 1
        SK: tl.constexpr = BLOCK_K // 32
        rows = tl.load(tile_start_ptr + tile) + tl.arange(0, BLOCK_M)
        rm = rows < tl.load(tile_end_ptr + tile)
        src = tl.load(a_idx_ptr + rows, mask=rm, other=0) if HAS_A_IDX else rows
        src = src.to(tl.int64)
        n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        nm = n < N
        ks = K // 32
        w_base = tl.load(w_tab + ex).to(tl.pointer_type(tl.uint8))
        sw_base = tl.load(sw_tab + ex).to(tl.pointer_type(tl.uint8))
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        if GATED:
            g_base = tl.load(g_tab + ex).to(tl.pointer_type(tl.uint8))
            sg_base = tl.load(sg_tab + ex).to(tl.pointer_type(tl.uint8))
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(
                a_ptr + src[:, None] * stride_am + kk[None, :], mask=rm[:, None] & (kk[None, :] < K), other=0
            )
            g = k0 // 32 + tl.arange(0, SK)
            gm = g[None, :] < ks
            sa = tl.load(
                sa_ptr + src[:, None] * ks + g[None, :], mask=rm[:, None] & gm, other=127
            )  # 127: 2**0
            kw = k0 // PK + tl.arange(0, BLOCK_K // PK)
            wmask = nm[None, :] & (kw[:, None] < K // PK)
            w = tl.load(w_base + n[None, :] * (K // PK) + kw[:, None], mask=wmask, other=0)
            sw = tl.load(sw_base + n[:, None] * ks + g[None, :], mask=nm[:, None] & gm, other=127)
            acc = _mma_step(a, sa, w, sw, acc, W_FMT, MMA, BLOCK_K, BLOCK_N)
            if GATED:
                wg = tl.load(g_base + n[None, :] * (K // PK) + kw[:, None], mask=wmask, other=0)
                sg = tl.load(sg_base + n[:, None] * ks + g[None, :], mask=nm[:, None] & gm, other=127)
                acc_g = _mma_step(a, sa, wg, sg, acc_g, W_FMT, MMA, BLOCK_K, BLOCK_N)
        if GATED:
            acc = swiglu(acc_g, acc, limit)
        c_rows = tl.load(c_idx_ptr + rows, mask=rm, other=0).to(tl.int64) if HAS_C_IDX else rows.to(tl.int64)
        tl.store(c_ptr + c_rows[:, None] * stride_cm + n[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=rm[:, None] & nm[None, :])  # fmt: skip


def mx_gemm(codes: torch.Tensor, scales: torch.Tensor, table: MXTable, sched, out: torch.Tensor, cfg,
            a_idx: torch.Tensor | None = None, c_idx: torch.Tensor | None = None, gate: MXTable | None = None,
            limit: float = 0.0) -> torch.Tensor:  # fmt: skip
    """``out[c_idx[i]] = act(codes[a_idx[i]]) @ table[expert of i].T`` over the sorted rows of ``sched``
    (``(tile_expert, tile_start, tile_end)``, ``gg.tile_schedule`` with ``cfg.block_m``); with ``gate``,
    ``swiglu(gate product, table product, limit)``. ``cfg`` from ``dispatch.mx_gemm_config``."""
    tile_ex, tile_start, tile_end = sched
    if tile_ex.numel() == 0 or codes.shape[0] == 0:
        return out
    g = gate if gate is not None else table
    grid = (tile_ex.numel(), triton.cdiv(table.n, cfg.block_n))
    _mx_gemm_kernel[grid](
        codes, scales, a_idx if a_idx is not None else tile_ex, table.ptrs, table.scale_ptrs, g.ptrs,
        g.scale_ptrs, out, c_idx if c_idx is not None else tile_ex, tile_ex, tile_start, tile_end, table.n,
        table.k, codes.stride(0), out.stride(0), float(limit), W_FMT=table.fmt, GATED=gate is not None,
        HAS_A_IDX=a_idx is not None, HAS_C_IDX=c_idx is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, MMA=cfg.mma, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **dispatch.pdl_args(codes.shape[0]),
    )  # fmt: skip
    return out
