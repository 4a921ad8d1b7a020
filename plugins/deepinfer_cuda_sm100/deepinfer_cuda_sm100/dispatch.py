"""Kernel choice by architecture and shape: the one place that picks block sizes, warps and stages.

It imports no triton, so selection logic is testable anywhere. Every launcher in
:mod:`deepinfer_cuda_sm100.kernels` asks a ``*_config`` function here and nothing
else. Each function looks at the problem shape and at :func:`arch`:

- ``"sm90"``: Hopper (H100/H200). These tables were tuned on an H200 (see benchmarks/gpu/NOTES.md).
- ``"sm100"``: Blackwell. No SM100 GPU was available to this project, so SM100 currently runs the
  same Triton kernels with the SM90 tables; nothing here has been run on SM100. SM100-specific
  variants (TMEM/UMMA kernels, native FP4 MMA) slot in as new branches keyed on ``"sm100"``.
- ``"interpreter"``: ``TRITON_INTERPRET=1`` on the CPU (CI). Small tiles; only correctness matters.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from dataclasses import dataclass, replace

import torch

from deepinfer_cuda_sm100.settings import active as settings


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"  # Triton's own switch, read as Triton reads it


@functools.lru_cache(maxsize=8)
def _arch_of(device_index: int) -> str:
    major, _ = torch.cuda.get_device_capability(device_index)
    return "sm100" if major >= 10 else "sm90"


def arch() -> str:
    """``"sm90"``, ``"sm100"`` or ``"interpreter"`` for the current device."""
    if _interpreting() or not torch.cuda.is_available():
        return "interpreter"
    return _arch_of(torch.cuda.current_device())


@functools.lru_cache(maxsize=8)
def num_sms() -> int:
    if arch() == "interpreter":
        return 4
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@functools.lru_cache(maxsize=1)
def has_griddepcontrol() -> bool:
    """Triton has ``griddepcontrol`` (3.3+: ``triton.language.extra.cuda.gdc_wait``), which the kernels'
    ``_common.pdl_enter`` compiles to. Looked up in Triton, not through the kernels (they import this module)."""
    try:
        import triton.language.extra.cuda as cuda_extra
    except ImportError:
        return False
    return hasattr(cuda_extra, "gdc_wait")


@functools.lru_cache(maxsize=8)
def _pdl_args(arch_name: str, enabled: bool) -> dict:
    if arch_name == "interpreter" or not enabled or not has_griddepcontrol():
        return {}
    return {"PDL": True, "launch_pdl": True}


#: kernels over at most this many tokens (or rows) launch with PDL (:func:`pdl_args`)
PDL_MAX_TOKENS = 16


def pdl_args(tokens: int, forked: bool = False) -> dict:
    """Launch arguments for programmatic dependent launch (``_common.pdl_enter``) of a kernel over ``tokens``
    tokens (rows): on SM90+ with a Triton that has ``griddepcontrol`` (3.3+), unless ``settings.pdl`` is off; none
    under the interpreter, which cannot run the PTX. CUDA graphs capture the launches' programmatic edges
    (CUDA 12.3+). Only few-token kernels: H200 v10 runs 2 and 4, slice steps with PDL against without in the
    same run: batch 1 -8% and -3%, batch 16 +0.5%, 64 +4.4% and +3.5%, 256 +2.9% and +1.6%. The many-wave
    kernels of large batches gain nothing from an earlier launch and lose a little. ``forked``: the launch's
    stream has just waited on another stream (a side branch's first kernel, or the first after its join), a wait
    PDL's programmatic edge must not stand in for: none (the H100's first side-branch check, with PDL there, did
    not give the same bytes; NOTES.md v34)."""
    if tokens > PDL_MAX_TOKENS or forked:
        return {}
    return _pdl_args(arch(), settings().pdl)


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _p2(n: int, lo: int = 1, hi: int = 1 << 30) -> int:
    """The next power of two ``>= n``, clamped to ``[lo, hi]``."""
    return min(hi, max(lo, 1 << (max(1, int(n)) - 1).bit_length()))


@dataclass(frozen=True)
class RowsConfig:
    block_d: int
    num_warps: int


def rows_config(d: int) -> RowsConfig:
    """RMSNorm: one program per row, the row streamed in ``block_d`` chunks (two passes)."""
    bd = _p2(d, 16, 4096)
    return RowsConfig(bd, 4 if bd <= 1024 else 8)


@dataclass(frozen=True)
class RopeConfig:
    block_h: int
    block_nope: int
    block_r2: int
    num_warps: int


def rope_config(h: int, nope: int, r2: int) -> RopeConfig:
    return RopeConfig(_p2(h, 1, 16), _p2(nope, 16, 512), _p2(r2, 2), 4)


@dataclass(frozen=True)
class AttentionConfig:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int


def attention_config(
    t: int, h: int, d: int, n_slots: int, fp8: bool = False, packed: bool = False
) -> AttentionConfig:
    """Sparse attention: ``block_h`` heads per program share each gathered KV tile. ``fp8``: V4's FP8 pool;
    ``packed``: V4.1's packed entries."""
    if arch() == "interpreter":
        return AttentionConfig(16, 16, 4, 1)
    if d > 512:
        # rows wider than V4's 512 channels (1,024-wide tiles; no model here has them): 16 heads x 16 slots, one
        # stage, which fits shared memory with float32 tiles (16 x 32 x 2 stages asked 364,864 bytes, H100)
        return AttentionConfig(16, 16, 8, 1)
    if d >= 256 and t == 1:
        # one query row (batch-1 decode; split-KV fills the SMs): 16 heads x 32 slots, 8 warps took 7.9 / 10.1 /
        # 16.8 us against 10.0 / 14.2 / 21.1 for the tiles below (bf16 / V4 FP8 / V4.1 packed pools, 64 heads of
        # 512, 640 slots; H100, one run, RESULTS v31 `runs/v31_call1_attntiles_h100.log`); from 16 rows the
        # tiles below win or tie
        return AttentionConfig(16, 32, 8, 2)
    if d >= 256 and (fp8 or packed):
        # every head of a token in one program, so each packed tile is decoded once, not once per 32 heads: the
        # decode, not the bytes, sets these kernels' time (about half as long at 16-256 rows as 32 x 32 tiles;
        # V4.1's wider decode fits one stage better). 32 heads x 64 slots does not fit shared memory.
        return AttentionConfig(_p2(h, 16, 64), 32, 8, 1 if packed else 2)
    if d >= 256 and t <= 256:
        # decode batches, bf16 rows: every head of a token in one program reads each gathered tile once (faster
        # than 32 x 64 at 16 and 256 rows, even at 64 once the split-KV chunks fill whole waves; RESULTS v36)
        return AttentionConfig(_p2(h, 16, 64), 32, 8, 2)
    if d >= 256:
        # H200 sweep (NOTES.md v1): 32 heads x 64 slots, 8 warps beat 16 x 32 x 4 warps by 18% at
        # decode (T=64) and 25% at prefill (T=2048), and every other of 8 shapes tried.
        return AttentionConfig(32, 64, 8, 2)
    return AttentionConfig(_p2(h, 16, 64), 64, 4, 2)


#: query rows from which a step over V4.1's packed pools unpacks each distinct entry once before the attention
#: and the indexer's scores instead of decoding entries in the kernel (prefill chunks). v25, 8k prefill: the
#: attention 241 -> 37 ms (8 layers); decode steps (a few hundred rows, graph-captured) stay in the kernel.
UNPACK_DISTINCT_ROWS = 1024


def attention_unpack_distinct(t: int) -> bool:
    """Unpack the distinct packed entries a step reads before its attention (see :data:`UNPACK_DISTINCT_ROWS`)."""
    return t >= UNPACK_DISTINCT_ROWS


def attention_splits(programs: int, n_slots: int, block_n: int) -> int:
    """Split-KV chunks per (token, head block) for sparse attention: only while ``programs`` (tokens x head
    blocks) fill under half the SMs (batch 1 has 2 programs for 64 heads), enough chunks of whole tiles to
    reach about one program per SM. Prediction (NOTES.md v9): batch-1 attention 28 -> under 10 us a layer.
    The chunks are rounded down, so the programs fill whole waves: one 64-head program fills an SM, and 64 of them
    split 3 ways would be 192 on 132 SMs, a third wave mostly idle; 2 ways are 128 (RESULTS v36)."""
    if 2 * programs > num_sms():
        return 1
    return max(1, min(_cdiv(n_slots, block_n), num_sms() // programs))


@dataclass(frozen=True)
class IndexerConfig:
    block_c: int
    splits: int
    num_warps: int
    num_stages: int


def indexer_config(t: int, hi: int, di: int, c: int) -> IndexerConfig:
    """Indexer scores: ``splits`` programs per token stride over blocks of ``block_c`` candidates."""
    bc = 16 if arch() == "interpreter" else 64
    splits = max(1, min(_cdiv(c, bc), _cdiv(4 * num_sms(), max(t, 1))))
    return IndexerConfig(bc, splits, 4, 1 if arch() == "interpreter" else 3)


#: the indexer's top-k by ``_topk_select_kernel`` on a GPU (else ``torch.topk``). H200 (check.py, NOTES.md
#: v7): the same selection as ``torch.topk`` at C=8192, k=512, in 27 us at T=8 and T=64 against 56 and 80 us
SELECT_KERNEL_ON_GPU = True
#: rows longer than this stay on ``torch.topk`` (one program holds a whole row in registers)
SELECT_MAX_COLUMNS = 16384


def indexer_select(c: int) -> str:
    """``"kernel"`` or ``"torch"``: how the indexer picks its top-k among ``c`` candidate scores."""
    on = arch() == "interpreter" or SELECT_KERNEL_ON_GPU
    return "kernel" if on and c <= SELECT_MAX_COLUMNS else "torch"


@dataclass(frozen=True)
class SelectConfig:
    num_warps: int
    #: the threshold by four digit histograms instead of 33 bisection counts (``settings.radix_select``)
    radix: bool = False


def select_config(c: int) -> SelectConfig:
    return SelectConfig(4 if c <= 2048 else 8 if c <= 8192 else 16, settings().radix_select)


@dataclass(frozen=True)
class CompressConfig:
    block_l: int
    num_warps: int


def compress_config(length: int, d: int) -> CompressConfig:
    if arch() == "interpreter":  # several row blocks per window even in small tests
        return CompressConfig(_p2(length, 1, 4), 4)
    return CompressConfig(_p2(length, 1, max(1, 4096 // _p2(d))), 4)


def compress_splits(windows: int, length: int, block_l: int) -> int:
    """Chunks of ``block_l`` rows per window, summed by separate programs, while ``windows`` fill under half
    the SMs: an HCA window (128 rows of 512 channels) at decode is one program streaming 512 KB otherwise."""
    if 2 * windows > num_sms():
        return 1
    return max(1, min(_cdiv(length, block_l), _cdiv(num_sms(), windows)))


@dataclass(frozen=True)
class HcMixesConfig:
    block_t: int
    block_k: int
    splits: int
    num_warps: int
    num_stages: int
    dot: bool = True  # tensor cores (3xTF32, 16 rows at least); False: CUDA-core float32 for one token


def hc_mixes_config(t: int, k: int, m: int) -> HcMixesConfig:
    """mHC mixes: split K so that about two programs per multiprocessor run at decode sizes.

    v1 capped the splits at 16 because the second kernel summed the partials with one dependent load per
    split (128 splits cost ~75 us at T=16 on the H200); it now loads all splits at once, so up to 64.
    One token skips ``tl.dot`` (its 16-row tile would be 15/16 padding): v8 run 10 measured those mixes at
    9.5 us against 18 us. At 8 tokens the broadcast products spilled (46 us), so only one. One token also
    takes up to 128 splits, one 128-wide step each (v9 run 2, ``hc_pre`` in a graph: 8.4 against 10.2 us)."""
    one = t == 1
    interp = arch() == "interpreter"
    if t > 1024:
        # prefill: 128-row tiles read the float32 ``fn`` from L2 a quarter as often as 32-row ones (it outweighed the
        # activations); 32-deep K steps, 4 stages. H100 (RESULTS v42, hc_mixes_tiles.py): 8,192 rows 637 -> 307 us,
        # 2,048 rows 244 -> 64 us
        bt, bk, stages = 128, 32 if not interp else 64, 4
    else:
        bt, bk, stages = 1 if one else 16, 128 if not interp else 64, 3
    programs = _cdiv(t, bt)
    splits = max(1, min(_cdiv(k, bk), _cdiv(2 * num_sms(), programs), 128 if one else 64))
    return HcMixesConfig(bt, bk, splits, 4, 1 if interp else stages, dot=not one)


@dataclass(frozen=True)
class HcRowsConfig:
    block_d: int
    num_warps: int


def hc_rows_config(n: int, d: int) -> HcRowsConfig:
    return HcRowsConfig(_p2(d, 16, 4096 // _p2(n)), 4)


def hc_split_config(t: int, n: int, d: int) -> HcRowsConfig:
    """``hc_pre``'s second launch. Its first channel block also runs the Sinkhorn iterations on the ``N x N``
    mixing matrix, a chain of ~40 dependent reductions that sets the launch's time at decode: in one warp they
    are shuffles, in four they go through shared memory with a barrier each. So few tokens get one-warp programs
    over narrower channel blocks (more programs; the collapse is a small part). v9 run 2, one token, ``hc_pre``
    in a graph: 11.3 us at 1024 channels x 4 warps, 10.2 at 256 x 1, 9.8 at 128 x 1."""
    if t <= 64 and arch() != "interpreter":
        return HcRowsConfig(_p2(d, 16, 512 // _p2(n)), 1)
    return hc_rows_config(n, d)


@dataclass(frozen=True)
class HcFusedConfig:
    #: launch 1: channels a program takes, of every stream (``cdiv(d, block_d)`` programs a token)
    block_d: int
    num_warps: int
    norm_block_d: int  # launch 2: channels a program collapses and norms
    norm_warps: int


#: tokens up to which a sublayer boundary's mHC runs as two launches (:func:`hc_fused_config`)
HC_FUSED_MAX_TOKENS = 2


def hc_fused_config(t: int, n: int, d: int, m: int) -> HcFusedConfig | None:
    """``hc_pre_norm`` / ``hc_post_pre`` in two launches (``mhc_boundary._hc_boundary_mix_kernel`` then
    ``_hc_collapse_norm_kernel``), or ``None``: the separate ``hc_post``, ``hc_pre`` (two launches) and
    ``rms_norm``. At decode each launch is a link of latency in the chain (v12 run 4, one token: 2.0 + 3.9 +
    5.7 + 2.4 us a boundary, against ~0.4 us of bytes). Launch 1 does ``hc_post``'s work inside the mixes'
    split over channels (32 channels of every stream a program: ~128 programs a token); launch 2 is the split
    kernel's one-warp shape (its first block runs the Sinkhorn, whose sums stay in each thread in one warp)
    and norms its channels with the square sum that launch 1's Gram partials give (NOTES.md v16).

    H200 v16 runs 4-5 (batch-1 slice step, alternating in one call): 0.933 ms on (five runs, 0.932-0.935)
    against 0.948-0.998 off; a boundary 11.3 us of kernel time against 13.7. Alone in a graph, 32-channel blocks
    9.9 us, 64-channel 7.2 (not yet tried in a step, where ``fn`` comes from DRAM). v14's one launch, whose last
    program finished the token, was slower in the step. Up to :data:`HC_FUSED_MAX_TOKENS` tokens, unless
    ``settings.hc_fused`` is off."""
    if not 0 < t <= HC_FUSED_MAX_TOKENS or not settings().hc_fused:
        return None
    return HcFusedConfig(_p2(d // 128, 16, 64), 4, _p2(d, 16, 512 // _p2(n)), 1)


def hc_side_coeffs(device: torch.device) -> bool:
    """The fused mHC boundary: the coefficients the next boundary reads (``post``, the Sinkhorn's ``comb``; V4.1's
    site entry its own ``pre`` too) by ``mhc._hc_coeffs_kernel`` on a side stream beside the collapse instead of
    after it on the current stream, whose next launch (the sublayer's) then waits for the 20 dependent Sinkhorn
    steps (``settings.hc_side_coeffs``). The same kernel either way, so the same bits. Under the interpreter the
    launches run in order."""
    return settings().hc_side_coeffs and (device.type == "cuda" or arch() == "interpreter")


@dataclass(frozen=True)
class RouteConfig:
    block_t: int
    num_warps: int


def route_config(t: int, e: int) -> RouteConfig:
    """Up to 16 tokens per program, about 4,096 scores; a program no larger than its tokens need, in one warp
    per 256 scores (one token over 256 experts: one warp, so each of the k argmax rounds is warp shuffles,
    with no shared memory or barrier)."""
    bt = min(_p2(4096 // _p2(e), 1, 16), _p2(t, 1, 16))
    return RouteConfig(bt, _p2(bt * _p2(e) // 256, 1, 4))


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
    rows_per_expert: float, n: int, k: int, fmt: str, gated: bool, active: tuple[int, int] | None = None
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
    return fit_split_k(whole_k_steps(_gemm_tiles(rows_per_expert, fmt, gated, weight_bytes), k), n, k, active)


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


def fit_split_k(cfg: GemmConfig, n: int, k: int, active: tuple[int, int] | None) -> GemmConfig:
    """``cfg`` with the K split its tiles need (:func:`split_k`); ``active`` as in :func:`gemm_config`."""
    if active is None:
        return cfg
    rows, experts = active
    tiles = experts * _cdiv(_cdiv(rows, max(experts, 1)), cfg.block_m)
    return replace(cfg, split_k=split_k(tiles * _cdiv(n, cfg.block_n), k, cfg.block_k))


def split_k(programs: int, k: int, block_k: int) -> int:
    """K slices per output tile so that about four programs per SM stream weights, each slice at
    least 512 deep (decode GEMMs have a few row tiles and long K)."""
    want = 4 * num_sms()
    if programs >= want:
        return 1
    return max(1, min(want // max(programs, 1), k // max(512, block_k)))


def _gemm_tiles(rows_per_expert: float, fmt: str, gated: bool, weight_bytes: float = 0) -> GemmConfig:
    if rows_per_expert <= GEMV_MAX_ROWS:
        return gemv_config(rows_per_expert, fmt, weight_bytes, gated)
    if arch() == "interpreter":
        return GemmConfig(16, 32, 64, 4, 1)
    # H200 sweep (NOTES.md v2): dequantising formats want 64+ row tiles (wgmma) even at decode,
    # where most rows of a tile are empty; FP8 at 64 rows 6.1 ms vs 10.6 ms at 16 (T=64).
    swap = settings().prefill_swap_ab  # the 128 x 128 tiles with the weight on the MMA's left (swap_ab)
    if fmt == "fp8_block":
        return (
            GemmConfig(64, 64, 64, 4, 4)
            if rows_per_expert <= 64
            else GemmConfig(128, 128, 64, 8, 3, swap_ab=swap)
        )
    if fmt == "fp4_e2m1" and rows_per_expert > 64:
        return GemmConfig(128, 128, settings().fp4_prefill_block_k, 8, 3, swap_ab=swap)
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


def gemv_config(rows_per_expert: float, fmt: str, weight_bytes: float = 0, gated: bool = False) -> GemmConfig:
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
    bm = 1 if rows_per_expert <= GEMV_MAX_ROWS else _p2(math.ceil(rows_per_expert), 1, 8)
    if arch() == "interpreter":
        return GemmConfig(bm, 16, 64, 4, 1, gemv=True)
    bn, bk = {"fp4_e2m1": (16, 512), "fp8_block": (8, 1024)}.get(fmt, (16, 256))
    wide = weight_bytes >= GEMV_WIDE_BYTES and not (gated and fmt == "fp8_block")
    warps = 4
    if bm == 1 and wide and fmt in _BYTES_PER_WEIGHT:
        bn, bk = 32, 512
        warps = 2 if fmt == "fp4_e2m1" and not gated else 4
    return GemmConfig(bm, bn, bk, warps, 1, gemv=True)


def fp4_decode_ptx(dtype: torch.dtype | None, scale_bytes: list[tuple[int, int] | None]) -> bool:
    """FP4 codes decoded by inline PTX (``gemv.e2m1_bf16_scaled``) rather than bit placement in Triton.

    H200 (NOTES.md v7): experts at 256 rows 1.97 vs 2.63 ms, one-row GEMV 130 vs 137 us. It applies on a
    GPU (SM90+, PTX cannot run under the interpreter) to ue8m0 scale bytes of at most 128 (``scale * 2**126``
    must fit bfloat16; ``None``: float32 scales) and, on the tensor cores, to bf16 activations (``dtype``;
    ``None`` for the GEMV, whose float32 FMAs take the exact bf16 weights for any activation dtype)."""
    return (
        arch() != "interpreter"
        and dtype in (None, torch.bfloat16)
        and all(b is not None and b[1] <= 128 for b in scale_bytes)
    )


def split_finish(cfg: GemmConfig) -> bool:
    """Split-K GEMMs finish in their last K slice (``_common.finish_split``) instead of a second launch:
    ``cfg.split_finish``, or ``settings.splitk_finish``. Off: on the H200 (NOTES.md v13 outcome) bitwise equal
    to the epilogue launch over 200 calls, but slower (FP8 wq_a alone 3.8 -> 4.5 us; the batch-1 step 0.96-0.97
    -> 1.02 ms)."""
    return cfg.split_finish or settings().splitk_finish


def gemv_prefetch(tokens: int) -> bool:
    """A dense GEMV (weights through tile tables no kernel writes) asks L2 for its weight rows before its
    programmatic-launch wait, so they stream in while the kernel before it runs (``settings.gemv_prefetch``):
    only where the launch is a PDL one (its programs can be resident before the kernel before it ends) and not
    under the interpreter (``cp.async.bulk.prefetch``, SM90+)."""
    return settings().gemv_prefetch and bool(pdl_args(tokens)) and arch() != "interpreter"


def prefetch_parts(cfg: GemmConfig, fmt: int) -> int:
    """Bulk prefetches a weight row of a :func:`gemv_prefetch` GEMV program: enough that its ``block_n`` rows give
    every thread one (a smaller tensor is replicated across threads, and each copy asked for the same bytes
    again: a layer 0.161 -> 0.192 ms on an H100, RESULTS v43), each a multiple of 16 bytes of a K step."""
    step_bytes = cfg.block_k // 2 if fmt == 2 else cfg.block_k
    parts = max(1, 32 * cfg.num_warps // cfg.block_n)
    while parts > 1 and step_bytes % (16 * parts):
        parts //= 2
    return parts


def fp8_kv_mode() -> int:
    """How the sparse-attention kernel scales V4's FP8 KV codes (``FP8`` of ``_load_kv``): 1, a row's scales
    loaded once and broadcast through reshapes (v8: FP8 decode 2.7-3.2x the bf16 pool's time, the reshapes
    the first suspect); 2, each channel gathers its group's scale, with ``settings.fp8_kv_scale_gather``; 3, as 1
    with the RoPE channels a tile of their own, never merged into the code tile, with ``settings.fp8_kv_rope_apart``
    (where a row's RoPE channels are the tile's last power-of-two group, as V4's 64 of 512; else 1)."""
    if settings().fp8_kv_scale_gather:
        return 2
    return 3 if settings().fp8_kv_rope_apart else 1


def radix_probs() -> bool:
    """The sampler's ``probs`` on the sort-free Triton kernels (``kernels/probs.py``): ``settings.radix_probs``."""
    return settings().radix_probs


def probs_compact_first() -> bool:
    """Top-p's searches over the non-negligible tokens, compacted in the first pass: ``settings.probs_compact_first``."""
    return settings().probs_compact_first


def graphed_probs() -> bool:
    """The sampler's ``probs`` replays a captured graph per bucket of rows (``ops/row_graphs.py``):
    ``settings.graphed_probs``."""
    return settings().graphed_probs


#: plain weights up to this size take the Triton GEMV at one row (:func:`plain_gemv`)
PLAIN_GEMV_MAX_BYTES = 64 << 20


def plain_gemv(rows: int, dtype: torch.dtype, weight: torch.Tensor) -> bool:
    """A plain (BF16/FP32) ``linear`` of one row on the Triton GEMV (float32 FMAs) rather than cuBLAS: at batch
    1 the MoE gate (256 x 4096 float32) took 4.4 us in cuBLAS's gemv and broke the chain of programmatic
    launches. Weights of the activation's dtype, or BF16 under float32 activations (exact either way);
    ``x @ w.T`` casts other weights to the activation's dtype first, which the GEMV would not. Weights of
    more than :data:`PLAIN_GEMV_MAX_BYTES` (the head, 1 GB, which cuBLAS streams at the copy rate) stay."""
    return (
        rows == 1
        and weight.numel() * weight.element_size() <= PLAIN_GEMV_MAX_BYTES
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


def fp4_h2_mode(cfg: GemmConfig, fp4: bool, dtype: torch.dtype, aligned: bool) -> int:
    """``FP4_H2`` of the GEMV kernel: one-row FP4 tiles in float16 pair arithmetic (``fp4_pairs.one_row_fp4_h2``)
    for bf16 and float16 activations, K whole steps and aligned rows: 2 by PTX on a GPU, 1 emulated in Triton
    under the interpreter; 0 (the float32 FMA path) otherwise. Float32 activations keep the float32 path, whose
    sums follow the float32 reference. ``settings.fp4_h2`` off turns it off (A/B runs)."""
    if not settings().fp4_h2:
        return 0
    if not (cfg.gemv and cfg.fp4_h2 and cfg.block_m == 1 and fp4 and aligned):
        return 0
    if dtype not in (torch.bfloat16, torch.float16):
        return 0
    return 1 if arch() == "interpreter" else 2


def dequant_gemm(rows: int, dtype: torch.dtype) -> bool:
    """A quantized dense GEMM of ``rows`` activations of ``dtype`` dequantises its weight (one launch, reading
    its bytes once and writing bf16) and runs on torch's GEMM (cuBLAS) instead of the tensor-core kernel that
    dequantises each tile for every row tile: from ``settings.dequant_gemm_rows`` rows (prefill). The weight's
    bf16 copy is temporary, as large as the weight in bf16."""
    limit = settings().dequant_gemm_rows
    return bool(limit) and rows >= limit and dtype in (torch.bfloat16, torch.float16)


#: FP8 GEMMs with at least this many rows (prefill chunks, above every decode graph's batch) may go to
#: the TileLang kernel
TILELANG_MIN_ROWS = 512


@functools.cache
def tilelang_installed() -> bool:
    return importlib.util.find_spec("tilelang") is not None


def fp8_gemm_backend(rows: int, n: int, k: int, dtype: torch.dtype) -> str:
    """``"tilelang"`` or ``"triton"`` for a dense FP8-block GEMM of ``rows`` activations of ``dtype``.

    TileLang's WGMMA kernel (``kernels/tl_fp8_gemm.py``) takes prefill-sized bf16 problems with ``N`` and
    ``K`` multiples of 128 on SM90 when tilelang is installed, unless ``settings.tilelang`` is off.
    SM100 stays on Triton: the TileLang kernel would compile for ``sm_100a`` but has never run there.
    """
    ok = (
        arch() == "sm90"
        and rows >= TILELANG_MIN_ROWS
        and n % 128 == 0
        and k % 128 == 0
        and dtype == torch.bfloat16
        and settings().tilelang
        and tilelang_installed()
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


def mx_gemm_config(rows: int, act_block: int) -> MXConfig | None:
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
    if arch() == "sm100" and settings().mx_gemm:
        return MXConfig(block_m=128, block_n=128, block_k=128, num_warps=4, num_stages=3)
    if arch() == "sm90" and settings().fp8_mma:
        return MXConfig(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=4, mma="fp8")
    return None


@dataclass(frozen=True)
class VocabConfig:
    block_v: int
    num_warps: int


def vocab_config(v: int) -> VocabConfig:
    """Row-wise passes over the vocabulary (penalties, bitmask): ``block_v`` columns per program."""
    bv = 256 if arch() == "interpreter" else 2048
    return VocabConfig(min(bv, _p2(v, 32)), 4)
