"""Kernel choice by architecture and shape: the one place the launchers ask for block sizes, warps and stages.

It imports no triton, so selection logic is testable anywhere. Every launcher in
:mod:`deepinfer_cuda_sm100.kernels` asks a ``*_config`` function here and nothing
else. The GEMM and GEMV tables are :mod:`deepinfer_cuda_sm100.gemm_shapes`, functions of the problem and of the
:func:`machine`; the entries below pass it. Each function looks at the problem shape and at :func:`arch`:

- ``"sm90"``: Hopper (H100/H200). These tables were tuned on an H200 (see benchmarks/gpu/NOTES.md).
- ``"sm100"``: Blackwell. No SM100 GPU was available to this project, so SM100 currently runs the
  same Triton kernels with the SM90 tables; nothing here has been run on SM100. SM100-specific
  variants (TMEM/UMMA kernels, native FP4 MMA) slot in as new branches keyed on ``"sm100"``.
- ``"interpreter"``: ``TRITON_INTERPRET=1`` on the CPU (CI). Small tiles; only correctness matters.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

from deepinfer_cuda_sm100 import gemm_shapes as gs
from deepinfer_cuda_sm100.gemm_shapes import (  # noqa: F401 - the GEMM tables' types and constants, re-exported
    GEMV_MAX_ROWS,
    GEMV_WIDE_BYTES,
    MX_MIN_ROWS,
    PLAIN_GROUPED_MAX_TOKENS,
    TILELANG_MIN_ROWS,
    GemmConfig,
    MXConfig,
    plain_grouped,
    whole_k_steps,
)
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


_cdiv, _p2 = gs.cdiv, gs.p2


def machine() -> gs.Machine:
    """This process's machine as the shape tables take it: :func:`arch`, :func:`num_sms`, the active settings."""
    return gs.Machine(arch(), settings(), num_sms)


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
    return hc_mixes_tile(t, k, bt, bk, 4, 1 if interp else stages, dot=not one)


def hc_mixes_tile(
    t: int, k: int, bt: int, bk: int, warps: int, stages: int, dot: bool = True
) -> HcMixesConfig:
    """The mixes launch at a given tile, K split so that about two programs a multiprocessor run (at most 64
    splits, 128 for one token's CUDA-core path): :func:`hc_mixes_config`'s rule, which the tile sweeps reuse."""
    splits = max(1, min(_cdiv(k, bk), _cdiv(2 * num_sms(), _cdiv(t, bt)), 64 if dot else 128))
    return HcMixesConfig(bt, bk, splits, warps, stages, dot=dot)


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


def gemm_config(
    rows_per_expert: float, n: int, k: int, fmt: str, gated: bool, active: tuple[int, int] | None = None
) -> GemmConfig:
    """Grouped expert GEMM (and the quantized dense linear, one expert): :func:`gemm_shapes.gemm_config`."""
    return gs.gemm_config(rows_per_expert, n, k, fmt, gated, active, machine())


def fit_split_k(cfg: GemmConfig, n: int, k: int, active: tuple[int, int] | None) -> GemmConfig:
    """``cfg`` with the K split its tiles need: :func:`gemm_shapes.fit_split_k`."""
    return gs.fit_split_k(cfg, n, k, active, machine())


def split_k(programs: int, k: int, block_k: int) -> int:
    """K slices per output tile: :func:`gemm_shapes.split_k`."""
    return gs.split_k(programs, k, block_k, machine())


def gemv_config(rows_per_expert: float, fmt: str, weight_bytes: float = 0, gated: bool = False) -> GemmConfig:
    """Decode tiles of the CUDA-core GEMV: :func:`gemm_shapes.gemv_config`."""
    return gs.gemv_config(rows_per_expert, fmt, weight_bytes, gated, machine())


def fp4_decode_ptx(dtype: torch.dtype | None, scale_bytes: list[tuple[int, int] | None]) -> bool:
    """FP4 codes decoded by inline PTX: :func:`gemm_shapes.fp4_decode_ptx`."""
    return gs.fp4_decode_ptx(dtype, scale_bytes, machine())


def split_finish(cfg: GemmConfig) -> bool:
    """Split-K finished by the last K slice: :func:`gemm_shapes.split_finish`."""
    return gs.split_finish(cfg, machine())


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
    """A plain ``linear`` of one row on the Triton GEMV: :func:`gemm_shapes.plain_gemv` up to
    :data:`PLAIN_GEMV_MAX_BYTES`."""
    return gs.plain_gemv(rows, dtype, weight, PLAIN_GEMV_MAX_BYTES)


def fp4_h2_mode(cfg: GemmConfig, fp4: bool, dtype: torch.dtype, aligned: bool) -> int:
    """``FP4_H2`` of the GEMV kernel: :func:`gemm_shapes.fp4_h2_mode`."""
    return gs.fp4_h2_mode(cfg, fp4, dtype, aligned, machine())


def dequant_gemm(rows: int, dtype: torch.dtype) -> bool:
    """A quantized dense GEMM on a dequantised weight and cuBLAS: :func:`gemm_shapes.dequant_gemm`."""
    return gs.dequant_gemm(rows, dtype, machine())


@functools.cache
def tilelang_installed() -> bool:
    return importlib.util.find_spec("tilelang") is not None


def fp8_gemm_backend(rows: int, n: int, k: int, dtype: torch.dtype) -> str:
    """``"tilelang"`` or ``"triton"`` for a dense FP8-block GEMM: :func:`gemm_shapes.fp8_gemm_backend`."""
    return gs.fp8_gemm_backend(rows, n, k, dtype, tilelang_installed(), machine())


def mx_gemm_config(rows: int, act_block: int) -> MXConfig | None:
    """The GEMM over FP8 activation codes, or ``None``: :func:`gemm_shapes.mx_gemm_config`."""
    return gs.mx_gemm_config(rows, act_block, machine())


@dataclass(frozen=True)
class VocabConfig:
    block_v: int
    num_warps: int


def vocab_config(v: int) -> VocabConfig:
    """Row-wise passes over the vocabulary (penalties, bitmask): ``block_v`` columns per program."""
    bv = 256 if arch() == "interpreter" else 2048
    return VocabConfig(min(bv, _p2(v, 32)), 4)
