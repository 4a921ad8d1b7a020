"""The GEMM and GEMV launch shapes, as functions of the problem and of the :class:`Machine` they run on.

:mod:`deepinfer_cuda_sm100.dispatch` calls each with the current machine (its ``arch()``, ``num_sms()`` and the active
settings) and is what the launchers ask; these functions read nothing else, so any shape can be asked for any
machine without patching. The tables were measured on an H200 and an H100 (benchmarks/gpu/NOTES.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from deepinfer_cuda_sm100.settings import CudaSM100Settings


@dataclass(frozen=True)
class Machine:
    #: ``"sm90"``, ``"sm100"`` or ``"interpreter"`` (:func:`dispatch.arch`)
    arch: str
    settings: CudaSM100Settings
    #: streaming multiprocessors, asked only by the shapes that need them (:func:`dispatch.num_sms`)
    sms: Callable[[], int]


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def p2(n: int, lo: int = 1, hi: int = 1 << 30) -> int:
    """The next power of two ``>= n``, clamped to ``[lo, hi]``."""
    return min(hi, max(lo, 1 << (max(1, int(n)) - 1).bit_length()))


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    #: programs per output tile along K (float32 partials, then a fixed-order sum: deterministic)
    split_k: int = 1
    #: the CUDA-core kernel for 1-8 rows per tile (``kernels/gemv.py``) instead of the tensor cores
    gemv: bool = False
    #: tensor-core kernel: FP4 codes decoded by bit placement into float16 (else integer arithmetic)
    fp4_bits: bool = True
    #: tensor-core FP4: codes decoded and scaled by PTX into packed bf16 (``gemv.e2m1_bf16_scaled``) where
    #: it applies (``grouped_gemm.fp4_asm_ok``; never under the interpreter)
    fp4_asm: bool = True
    #: one-row FP4 GEMV tiles in float16 pair arithmetic where it applies (:func:`fp4_h2_mode`)
    fp4_h2: bool = True
    #: split-K tiles finished by their last K slice, no epilogue launch (:func:`split_finish`)
    split_finish: bool = False
    #: tensor-core kernel: the weight tile is the MMA's left operand (``C.T = W @ A.T``), so SM90's wgmma reads the
    #: dequantised tile from registers
    swap_ab: bool = False


#: decode problems with at most this many rows per expert go to the CUDA-core GEMV kernel, one row per
#: tile. H200 (benchmarks/gpu/NOTES.md v6): 1-row tiles beat the tensor cores 1.5-3x on the FP8 1-row
#: projections and FP4 experts at batch 1, and 17% on FP4 experts at batch 16 (1.2 rows per expert);
#: tiles of 2-8 rows are slower than the tensor cores (batch 16: 3.0 vs 2.4 ms).
GEMV_MAX_ROWS = 1.5


#: bytes a weight element takes in the quantized formats (others: bf16, 2)
_BYTES_PER_WEIGHT = {"fp4_e2m1": 0.5, "fp8_block": 1, "fp8_block32": 1}


def gemm_config(
    rows_per_expert: float, n: int, k: int, fmt: str, gated: bool, active: tuple[int, int] | None, m: Machine
) -> GemmConfig:
    """Grouped expert GEMM (and the quantized dense linear, one expert).

    ``block_k`` never exceeds 128, so an FP8 K step lies in one 128-wide scale block (or spans whole
    32-wide ones, ``fp8_block32``), and is a multiple of 64, so an FP4 step holds whole 32-value scale
    groups. ``fp8_block32`` takes ``fp8_block``'s tiles (the GEMV's ``block_n`` of 8 or 32 divides 32).
    ``active``: ``(rows, experts holding them)``, at most; when the row tiles they make are too few programs
    to keep every SM streaming weights (decode), K is split (:func:`split_k`).
    """
    fmt = "fp8_block" if fmt == "fp8_block32" else fmt  # V4.1's 32 x 32 scale blocks: V4's tiles
    experts = active[1] if active is not None else 1
    weight_bytes = n * k * experts * (2 if gated else 1) * _BYTES_PER_WEIGHT.get(fmt, 2)
    return fit_split_k(
        whole_k_steps(_gemm_tiles(rows_per_expert, fmt, gated, weight_bytes, m), k), n, k, active, m
    )


def whole_k_steps(cfg: GemmConfig, k: int) -> GemmConfig:
    """GEMV tiles whose K step does not divide ``k`` take the largest halving of it (down to 128) that does: the
    kernel's unmasked 16-byte loads and the float16-pair FP4 path need whole steps. V4's depths (1,024-7,168)
    keep their steps; V4.1's 1,280 (``wq_b``) and 2,304 (the experts' and shared expert's down projections)
    take 256. (Prediction from the masked path's cost, NOTES.md v7; not measured on V4.1's shapes.)"""
    if not cfg.gemv or k % cfg.block_k == 0:
        return cfg
    bk = cfg.block_k
    while bk > 128 and k % bk:
        bk //= 2
    return replace(cfg, block_k=bk) if k % bk == 0 else cfg


def fit_split_k(cfg: GemmConfig, n: int, k: int, active: tuple[int, int] | None, m: Machine) -> GemmConfig:
    """``cfg`` with the K split its tiles need (:func:`split_k`); ``active`` as in :func:`gemm_config`."""
    if active is None:
        return cfg
    rows, experts = active
    tiles = experts * cdiv(cdiv(rows, max(experts, 1)), cfg.block_m)
    return replace(cfg, split_k=split_k(tiles * cdiv(n, cfg.block_n), k, cfg.block_k, m))


def split_k(programs: int, k: int, block_k: int, m: Machine) -> int:
    """K slices per output tile so that about four programs per SM stream weights, each slice at
    least 512 deep (decode GEMMs have a few row tiles and long K)."""
    want = 4 * m.sms()
    if programs >= want:
        return 1
    return max(1, min(want // max(programs, 1), k // max(512, block_k)))


def _gemm_tiles(rows_per_expert: float, fmt: str, gated: bool, weight_bytes: float, m: Machine) -> GemmConfig:
    if rows_per_expert <= GEMV_MAX_ROWS:
        return gemv_config(rows_per_expert, fmt, weight_bytes, gated, m)
    if m.arch == "interpreter":
        return GemmConfig(16, 32, 64, 4, 1)
    # H200 sweep (NOTES.md v2): dequantising formats want 64+ row tiles (wgmma) even at decode,
    # where most rows of a tile are empty; FP8 at 64 rows 6.1 ms vs 10.6 ms at 16 (T=64).
    swap = m.settings.prefill_swap_ab  # the 128 x 128 tiles with the weight on the MMA's left (swap_ab)
    if fmt == "fp8_block":
        return (
            GemmConfig(64, 64, 64, 4, 4)
            if rows_per_expert <= 64
            else GemmConfig(128, 128, 64, 8, 3, swap_ab=swap)
        )
    if fmt == "fp4_e2m1" and rows_per_expert > 64:
        return GemmConfig(128, 128, m.settings.fp4_prefill_block_k, 8, 3, swap_ab=swap)
    bm = (
        16
        if rows_per_expert <= 16
        else 32
        if rows_per_expert <= 32
        else 64
        if rows_per_expert <= 256
        else 128
    )
    # FP4 gate/up at <= 16 rows: 128-wide N blocks, H200 (NOTES.md v6): experts at 64 and 256 rows 9% faster
    bn = 64 if (gated and not (fmt == "fp4_e2m1" and bm == 16)) or bm >= 128 else 128
    warps = 4 if bm <= 64 else 8
    return GemmConfig(bm, bn, 64, warps, 3 if fmt == "fp4_e2m1" else 4)


#: GEMV calls reading at least this many weight bytes take 32 x 512 tiles (:func:`gemv_config`)
GEMV_WIDE_BYTES = 16 << 20


def gemv_config(rows_per_expert: float, fmt: str, weight_bytes: float, gated: bool, m: Machine) -> GemmConfig:
    """Decode: tiles of ``block_m`` rows (1 as dispatched; up to 8 when forced); each program streams
    ``block_n`` weight rows in ``block_k``-wide steps (``block_n`` divides 128 for the FP8 block scales).

    H200, v10 run 4 (``gemm_kernels.py``, weights cold in L2 as in a decode step): calls of 16 MB and more
    are fastest in 32-row tiles of 512 (FP8 wq_b 32 MB 11.8 -> 10.3 us, wo_b 14.6 -> 11.7; FP4 experts at
    batch 1, gate+up and down, 70.1 -> 56.9 us); smaller ones in 8 x 1024 (FP8 wq_a 4.3 us against 5.2).
    Gated FP8 (the shared expert) keeps 8 x 1024: two 32 x 512 FP8 tiles a step were not measured.
    The FP4 experts' down projection (not gated) takes 32 x 512 in two-warp programs: at four warps its 768
    programs ran 1.16 waves; v15 run 2, gate+up and down at batch 1, 39.5 -> 37.5 us (other shapes of the down
    projection alone: 37.9-42.9 us)."""
    fmt = "fp8_block" if fmt == "fp8_block32" else fmt
    # the kernel unrolls at most 8 rows
    bm = 1 if rows_per_expert <= GEMV_MAX_ROWS else p2(math.ceil(rows_per_expert), 1, 8)
    if m.arch == "interpreter":
        return GemmConfig(bm, 16, 64, 4, 1, gemv=True)
    bn, bk = {"fp4_e2m1": (16, 512), "fp8_block": (8, 1024)}.get(fmt, (16, 256))
    wide = weight_bytes >= GEMV_WIDE_BYTES and not (gated and fmt == "fp8_block")
    warps = 4
    if bm == 1 and wide and fmt in _BYTES_PER_WEIGHT:
        bn, bk = 32, 512
        warps = 2 if fmt == "fp4_e2m1" and not gated else 4
    return GemmConfig(bm, bn, bk, warps, 1, gemv=True)


def fp4_decode_ptx(dtype: torch.dtype | None, scale_bytes: list[tuple[int, int] | None], m: Machine) -> bool:
    """FP4 codes decoded by inline PTX (``gemv.e2m1_bf16_scaled``) rather than bit placement in Triton.

    H200 (NOTES.md v7): experts at 256 rows 1.97 vs 2.63 ms, one-row GEMV 130 vs 137 us. It applies on a
    GPU (SM90+, PTX cannot run under the interpreter) to ue8m0 scale bytes of at most 128 (``scale * 2**126``
    must fit bfloat16; ``None``: float32 scales) and, on the tensor cores, to bf16 activations (``dtype``;
    ``None`` for the GEMV, whose float32 FMAs take the exact bf16 weights for any activation dtype)."""
    return (
        m.arch != "interpreter"
        and dtype in (None, torch.bfloat16)
        and all(b is not None and b[1] <= 128 for b in scale_bytes)
    )


def split_finish(cfg: GemmConfig, m: Machine) -> bool:
    """Split-K GEMMs finish in their last K slice (``_common.finish_split``) instead of a second launch:
    ``cfg.split_finish``, or ``settings.splitk_finish``. Off: on the H200 (NOTES.md v13 outcome) bitwise equal
    to the epilogue launch over 200 calls, but slower (FP8 wq_a alone 3.8 -> 4.5 us; the batch-1 step 0.96-0.97
    -> 1.02 ms)."""
    return cfg.split_finish or m.settings.splitk_finish


def plain_gemv(rows: int, dtype: torch.dtype, weight: torch.Tensor, max_bytes: int) -> bool:
    """A plain (BF16/FP32) ``linear`` of one row on the Triton GEMV (float32 FMAs) rather than cuBLAS: at batch
    1 the MoE gate (256 x 4096 float32) took 4.4 us in cuBLAS's gemv and broke the chain of programmatic
    launches. Weights of the activation's dtype, or BF16 under float32 activations (exact either way);
    ``x @ w.T`` casts other weights to the activation's dtype first, which the GEMV would not. Weights of
    more than ``max_bytes`` (the head, 1 GB, which cuBLAS streams at the copy rate) stay."""
    return (
        rows == 1
        and weight.numel() * weight.element_size() <= max_bytes
        and weight.dim() == 2
        and weight.stride(-1) == 1
        and (weight.dtype == dtype or (weight.dtype == torch.bfloat16 and dtype == torch.float32))
    )


#: most rows a step's plain grouped projection runs on the grouped GEMM with (beyond: cuBLAS per group)
PLAIN_GROUPED_MAX_TOKENS = 16


def plain_grouped(t: int, dtype: torch.dtype, weights: list) -> bool:
    """Plain weights of a grouped projection (V4.1's ``wo_a``, held dequantised as DeepSeek's reference holds it)
    through one grouped GEMM instead of a GEMV or cuBLAS call per group: up to
    :data:`PLAIN_GROUPED_MAX_TOKENS` rows, weights of one shape, row-major, of the activation's dtype (or BF16
    under float32 activations), as :func:`plain_gemv` takes them."""
    w0 = weights[0]
    return (
        0 < t <= PLAIN_GROUPED_MAX_TOKENS
        and all(
            isinstance(w, torch.Tensor) and w.shape == w0.shape and w.dtype == w0.dtype and w.stride(-1) == 1
            for w in weights
        )
        and w0.dim() == 2
        and (w0.dtype == dtype or (w0.dtype == torch.bfloat16 and dtype == torch.float32))
    )


def fp4_h2_mode(cfg: GemmConfig, fp4: bool, dtype: torch.dtype, aligned: bool, m: Machine) -> int:
    """``FP4_H2`` of the GEMV kernel: one-row FP4 tiles in float16 pair arithmetic (``fp4_pairs.one_row_fp4_h2``)
    for bf16 and float16 activations, K whole steps and aligned rows: 2 by PTX on a GPU, 1 emulated in Triton
    under the interpreter; 0 (the float32 FMA path) otherwise. Float32 activations keep the float32 path, whose
    sums follow the float32 reference. ``settings.fp4_h2`` off turns it off (A/B runs)."""
    if not m.settings.fp4_h2:
        return 0
    if not (cfg.gemv and cfg.fp4_h2 and cfg.block_m == 1 and fp4 and aligned):
        return 0
    if dtype not in (torch.bfloat16, torch.float16):
        return 0
    return 1 if m.arch == "interpreter" else 2


def dequant_gemm(rows: int, dtype: torch.dtype, m: Machine) -> bool:
    """A quantized dense GEMM of ``rows`` activations of ``dtype`` dequantises its weight (one launch, reading
    its bytes once and writing bf16) and runs on torch's GEMM (cuBLAS) instead of the tensor-core kernel that
    dequantises each tile for every row tile: from ``settings.dequant_gemm_rows`` rows (prefill). The weight's
    bf16 copy is temporary, as large as the weight in bf16."""
    limit = m.settings.dequant_gemm_rows
    return bool(limit) and rows >= limit and dtype in (torch.bfloat16, torch.float16)


#: FP8 GEMMs with at least this many rows (prefill chunks, above every decode graph's batch) may go to
#: the TileLang kernel
TILELANG_MIN_ROWS = 512


def fp8_gemm_backend(rows: int, n: int, k: int, dtype: torch.dtype, tilelang: bool, m: Machine) -> str:
    """``"tilelang"`` or ``"triton"`` for a dense FP8-block GEMM of ``rows`` activations of ``dtype``.

    TileLang's WGMMA kernel (``kernels/tl_fp8_gemm.py``) takes prefill-sized bf16 problems with ``N`` and
    ``K`` multiples of 128 on SM90 when tilelang is installed (``tilelang``), unless ``settings.tilelang`` is off.
    SM100 stays on Triton: the TileLang kernel would compile for ``sm_100a`` but has never run there.
    """
    ok = (
        m.arch == "sm90"
        and rows >= TILELANG_MIN_ROWS
        and n % 128 == 0
        and k % 128 == 0
        and dtype == torch.bfloat16
        and m.settings.tilelang
        and tilelang
    )
    return "tilelang" if ok else "triton"


#: rows from which an SM100 GEMM with the release's FP8 activations runs on the MX MMA (prefill; decode rows keep
#: the GEMV over round-tripped values, which reads the same weight bytes without 128-row tiles)
MX_MIN_ROWS = 128


@dataclass(frozen=True)
class MXConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    #: "mx": the block-scaled MMA (SM100); "fp8": e4m3 MMAs of one scale block each, scaled partial sums (SM90)
    mma: str = "mx"


def mx_gemm_config(rows: int, act_block: int, m: Machine) -> MXConfig | None:
    """The GEMM over FP8 activation codes (``kernels/mx_gemm.py``) for ``rows`` activations quantised per
    ``act_block``, or ``None`` (the W8A16 kernels over round-tripped activations): 32-value blocks, at least
    :data:`MX_MIN_ROWS` rows, and

    - SM100, unless ``settings.mx_gemm`` is off: the block-scaled MX MMA (``tcgen05.mma ... block_scale``), 128-row
      tiles (Triton 3.9 lowers ``dot_scaled`` with smaller M tiles to an upcast ``kind::f16`` MMA);
    - SM90 with ``settings.fp8_mma`` (off by default): e4m3 ``wgmma`` over one 32-value scale block at a time,
      each step's partial sums scaled on the CUDA cores (Hopper has no MX MMA). Measured on the H200 (v25): 62-91
      TFLOP/s at 4,096 rows, each step waiting for its ``wgmma`` before the scaling; the W8A16 kernels over the
      round-tripped activations are faster.

    Tile sizes are not tuned (the SM100 path has never run)."""
    if act_block != 32 or rows < MX_MIN_ROWS:
        return None
    if m.arch == "sm100" and m.settings.mx_gemm:
        return MXConfig(block_m=128, block_n=128, block_k=128, num_warps=4, num_stages=3)
    if m.arch == "sm90" and m.settings.fp8_mma:
        return MXConfig(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=4, mma="fp8")
    return None
