"""The ``cuda_sm100`` section of the engine configuration: the kernels' switches, each a typed field.

Set by argument (``LLM(cuda_sm100={"pdl": False})``), environment (``DEEPINFER_CUDA_SM100__PDL=0``) or config
file (``[cuda_sm100]`` then ``pdl = false``). When an engine is built the platform makes its settings the
active ones (:meth:`~deepinfer_cuda_sm100.platform.CudaSM100Platform.finalize` calls :func:`use`), which
:mod:`deepinfer_cuda_sm100.dispatch` reads as it picks each launch's shape: the kernels are process-wide, as
their compiled variants are. Defaults are what the H200 measurements chose (benchmarks/gpu/NOTES.md)."""

from __future__ import annotations

from pydantic import Field, field_validator

from deepinfer_core.plugin_api import PlatformSettings


class CudaSM100Settings(PlatformSettings):
    pdl: bool = Field(
        True, description="programmatic dependent launch of few-token kernels on SM90+ (dispatch.pdl_args)"
    )
    hc_fused: bool = Field(
        True, description="a sublayer boundary's mHC in two launches at 1-2 tokens (dispatch.hc_fused_config)"
    )
    hc_side_coeffs: bool = Field(
        True,
        description="the fused mHC boundary computes the coefficients the next boundary reads (post and the "
        "Sinkhorn's comb; V4.1's site entry its own pre too) on a side stream joined at the next mHC op, off the "
        "critical path (dispatch.hc_side_coeffs); off: the same kernel after the collapse, the same bits. On as "
        "measured on an H100: a V4.1 layer 2.8% faster (2026-12-06, RESULTS v35), a V4 layer at batch 1 0.169 -> "
        "0.155 ms (2026-12-07, RESULTS v43), greedy tokens equal",
    )
    splitk_finish: bool = Field(
        False,
        description="split-K GEMMs finished by their last K slice instead of an epilogue launch (equal, slower)",
    )
    fp4_h2: bool = Field(
        True, description="one-row FP4 GEMV tiles in float16 pair arithmetic (dispatch.fp4_h2_mode)"
    )
    mx_gemm: bool = Field(
        True,
        description="SM100: prefill GEMMs with FP8 activations (activation_quant='fp8') on the block-scaled MX MMA "
        "(dispatch.mx_gemm_config; compiled for sm_100a, never run on one)",
    )
    fp8_mma: bool = Field(
        False,
        description="SM90: prefill GEMMs with FP8 activations (activation_quant='fp8') on e4m3 wgmma, one 32-value "
        "scale block a step (dispatch.mx_gemm_config); off: measured on the H200 at 8-12% of the BF16 matmul rate (v25)",
    )
    graphed_probs: bool = Field(
        True,
        description="the sampler's probs (temperature, top-k, top-p, min-p) replayed from a CUDA graph per bucket "
        "of up to 16 rows (ops/row_graphs.py): three launches instead of ~30 a step; on as measured on an H100 "
        "(2026-12-05, RESULTS v29: the V4 engine's overlapped batch-1 step 2.46-3.07 -> 1.51-1.58 ms, batch 16 "
        "unchanged)",
    )
    radix_probs: bool = Field(
        True,
        description="the sampler's probs on Triton kernels over chunks of every row, top-k and top-p by radix "
        "searches on the values' bits (kernels/probs.py); off: the torch sorts",
    )
    probs_compact_first: bool = Field(
        True,
        description="top-p's searches in the sort-free probs count only the tokens above half of (1 - top_p) / V, "
        "which the softmax kernel's first pass writes out, and the nine passes after it run small programs over "
        "those (kernels/probs.py); off: compaction after pass 3, every pass's program 8 warps. On as measured on an "
        "H100 (benchmarks/gpu/NOTES.md v37: 256 rows 1.02 -> 0.62 ms graphed, the reference's kept tokens)",
    )
    radix_select: bool = Field(
        False,
        description="the indexer's top-k select kernel finds its threshold by four 8-bit digit histograms instead "
        "of bisection counts over the row (kernels/indexer.py); off as measured on an H100 (2026-12-06, RESULTS v33: "
        "a tie at one row, 2.4x slower batched, the V4.1 slice's batch-1 layer 0.242 -> 0.257 ms with it)",
    )
    fp8_kv_scale_gather: bool = Field(
        False,
        description="V4's FP8 KV in the sparse-attention kernel: each channel gathers its group's scale instead of "
        "broadcasting a row's scales through reshapes (dispatch.fp8_kv_mode). Off: check.py --only attention on "
        "an H100 (RESULTS v29, v39) timed it slower, 208.8 against 93.2 us at 64 rows in v39",
    )
    fp8_kv_rope_apart: bool = Field(
        False,
        description="V4's FP8 KV in the sparse-attention kernel: the 64 RoPE channels of a row as a key tile of "
        "their own with dots of their own, not merged into the 512-channel tile of decoded codes "
        "(dispatch.fp8_kv_mode 3). Off: timed in the kernel on an H100 (RESULTS v39) it is slower than the merged "
        "tile, 108.7 against 93.2 us at 64 rows, and the V4 slice's step 0.3-2.6% longer at every batch",
    )
    dequant_gemm_rows: int = Field(
        1024,
        ge=0,
        description="quantized dense GEMMs (FP8 and FP4 linears, the shared expert) of at least this many rows "
        "dequantise the weight to the activations' dtype (gg.dequantize: the values the Triton kernel multiplies) "
        "and run on the library's GEMM (dispatch.dequant_gemm); 0 turns it off. 1024: V4's 8k prefill 107.4-108.2 -> "
        "99.8-99.9 ms on an H100, three processes each (RESULTS v41)",
    )
    prefill_swap_ab: bool = Field(
        False,
        description="the tensor-core GEMM tiles of more than 64 rows per expert (prefill; FP8 and FP4 weights) "
        "multiply with the dequantised weight tile as the MMA's left operand (GemmConfig.swap_ab); off: slower on an "
        "H100 (V4's FP4 experts at 8k rows 12.7-13.7 against 10.4-12.3 ms unswapped, RESULTS v41)",
    )
    fp4_prefill_block_k: int = Field(
        128,
        description="K step (64 or 128) of the tensor-core tiles of FP4 expert GEMMs at more than 64 rows per expert "
        "(prefill: (128, 128, block_k, 8 warps, 3 stages)); 128 decodes twice the weight codes per step. 128: V4's 8k "
        "prefill 99.1-99.4 -> 91.6 ms on an H100, three processes each (RESULTS v42); the routed experts 12.3 -> "
        "10.3-10.4 ms in the kernel (v40-v42)",
    )
    tilelang: bool = Field(
        True,
        description="prefill FP8 GEMMs on the TileLang kernel on SM90 where installed (dispatch.fp8_gemm_backend)",
    )

    @field_validator("fp4_prefill_block_k")
    @classmethod
    def _whole_scale_groups(cls, value: int) -> int:
        if value not in (64, 128):
            raise ValueError(f"fp4_prefill_block_k must be 64 or 128, got {value}")
        return value


_active = CudaSM100Settings()


def active() -> CudaSM100Settings:
    """The settings of the engine built last in this process (the defaults before any)."""
    return _active


def use(settings: CudaSM100Settings) -> None:
    """Make ``settings`` the active ones."""
    global _active
    _active = settings
