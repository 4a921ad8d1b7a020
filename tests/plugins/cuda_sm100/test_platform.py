"""The cuda_sm100 platform's availability probe, backend selection and hook wiring (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.plugins.registry import BackendSelectionError, select_platform
from deepinfer_core.runtime import build_registry
from deepinfer_cuda_sm100 import dispatch, plugin, settings
from deepinfer_cuda_sm100.platform import probe_cuda

from .cuda_sm100_helpers import needs_triton


def _fake_gpu(monkeypatch, capability, name="NVIDIA H200"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)


def test_probe_without_cuda_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a = probe_cuda()
    assert not a.available
    assert "compute capability >= 9.0" in a.reason


def test_probe_rejects_ampere(monkeypatch):
    _fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    a = probe_cuda()
    assert not a.available and "A100" in a.reason and "8.0" in a.reason


@pytest.mark.parametrize(("cap", "text"), [((9, 0), "SM90"), ((10, 0), "SM100")])
def test_probe_accepts_hopper_and_blackwell(monkeypatch, cap, text):
    _fake_gpu(monkeypatch, cap)
    a = probe_cuda()
    assert a.available and text in a.reason


def _registry():
    return build_registry(allow=["cuda_sm100"], extra_plugins=[])


def test_auto_picks_cuda_when_available(monkeypatch):
    _fake_gpu(monkeypatch, (9, 0))
    reg = _registry()
    assert select_platform(reg, "auto").name == "cuda_sm100"


def test_auto_falls_back_to_reference_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_platform(_registry(), "auto").name == "reference"


def test_explicit_backend_unavailable_names_the_reason(monkeypatch):
    _fake_gpu(monkeypatch, (8, 6), "NVIDIA RTX 3090")
    with pytest.raises(BackendSelectionError, match="RTX 3090 has compute capability 8.6"):
        select_platform(_registry(), "cuda_sm100")


def test_op_hooks_ignore_other_platforms():
    for concern in ("dense", "attention", "moe", "sampling", "memory", "comm"):
        assert getattr(plugin, f"deepinfer_{concern}_ops")(platform="reference", config=None) is None


@needs_triton
def test_op_hooks_serve_cuda_sm100():
    from deepinfer_core.ops.backends import CONCERNS

    names = {c: type(getattr(plugin, f"deepinfer_{c}_ops")(platform="cuda_sm100", config=None)).__name__
             for c in CONCERNS if c != "memory"}  # fmt: skip
    assert names == {
        "dense": "CudaDenseOps", "attention": "CudaAttentionOps", "moe": "CudaMoEOps",
        "sampling": "CudaSamplingOps", "comm": "NcclCommOps",
    }  # fmt: skip


def test_dispatch_arch_by_capability(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    dispatch._arch_of.cache_clear()
    _fake_gpu(monkeypatch, (10, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert dispatch.arch() == "sm100"
    dispatch._arch_of.cache_clear()
    _fake_gpu(monkeypatch, (9, 0))
    assert dispatch.arch() == "sm90"
    dispatch._arch_of.cache_clear()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.arch() == "interpreter"


def test_gemm_config_keeps_quant_blocks_aligned(monkeypatch):
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    for rows in (1, 2, 20, 100, 5000):
        for fmt in ("plain", "fp8_block", "fp4_e2m1"):
            cfg = dispatch.gemm_config(rows, 4096, 2048, fmt, gated=rows % 2 == 0)
            if cfg.gemv:  # one-row decode tiles: whole FP4 scale groups per step, FP8 scale rows per program
                assert rows <= dispatch.GEMV_MAX_ROWS and 1 <= cfg.block_m <= 8
                assert cfg.block_k % 32 == 0 and 128 % cfg.block_n == 0
                continue
            assert 128 % cfg.block_k == 0 and cfg.block_k % 64 == 0
            assert cfg.block_m >= 16


def test_gemm_shapes_are_functions_of_the_machine_they_are_given():
    """``gemm_shapes`` reads nothing but its arguments: one process asks the tables for an H100, an SM100 part and
    the interpreter, with other settings, and gets each one's shapes; ``dispatch`` asks them for this machine."""
    from deepinfer_cuda_sm100 import gemm_shapes as gs

    def on(arch, **setting):
        return gs.Machine(arch, settings.CudaSM100Settings(**setting), lambda: 132)

    prefill = (192, 2048, 4096, "fp4_e2m1", True, None)
    assert gs.gemm_config(*prefill, on("sm90")).block_k == 128
    assert gs.gemm_config(*prefill, on("sm90", fp4_prefill_block_k=64)).block_k == 64
    assert gs.gemm_config(*prefill, on("interpreter")) == gs.GemmConfig(16, 32, 64, 4, 1)
    decode = gs.gemm_config(1, 32768, 1024, "fp8_block", False, (1, 1), on("sm90"))
    assert decode.gemv and (decode.block_n, decode.block_k) == (32, 512) and decode.split_k == 1
    few = gs.gemm_config(1, 1536, 4096, "fp8_block", False, (1, 1), on("sm90"))
    assert few.split_k == gs.split_k(gs.cdiv(1536, few.block_n), 4096, few.block_k, on("sm90")) > 1
    assert gs.mx_gemm_config(256, 32, on("sm100")).mma == "mx"
    assert gs.mx_gemm_config(256, 32, on("sm100", mx_gemm=False)) is None
    assert gs.fp8_gemm_backend(8192, 4096, 8192, torch.bfloat16, True, on("sm90")) == "tilelang"
    assert gs.fp8_gemm_backend(8192, 4096, 8192, torch.bfloat16, False, on("sm90")) == "triton"
    args = (1, 4096, 2048, "fp4_e2m1", False, (1, 6))
    assert dispatch.gemm_config(*args) == gs.gemm_config(*args, dispatch.machine())


def test_decode_gemms_take_the_gemv_kernel_only_for_one_row_tiles(monkeypatch):
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "num_sms", lambda: 132)
    assert dispatch.gemm_config(1, 1024, 4096, "fp8_block", gated=False, active=(1, 1)).gemv
    assert dispatch.gemm_config(6 / 6, 2048, 4096, "fp4_e2m1", gated=True, active=(6, 6)).gemv
    assert dispatch.gemm_config(1.2, 2048, 4096, "fp4_e2m1", gated=True, active=(96, 81)).block_m == 1
    assert not dispatch.gemm_config(1.9, 2048, 4096, "fp4_e2m1", gated=True, active=(384, 200)).gemv
    assert not dispatch.gemm_config(4, 1024, 4096, "fp8_block", gated=False, active=(4, 1)).gemv


def test_decode_gemvs_of_16_mb_and_more_take_32_by_512_tiles(monkeypatch):
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "num_sms", lambda: 132)

    def tile(n, k, fmt, gated, active):
        cfg = dispatch.gemm_config(1, n, k, fmt, gated=gated, active=active)
        assert cfg.gemv
        return cfg.block_n, cfg.block_k

    assert tile(32768, 1024, "fp8_block", False, (1, 1)) == (32, 512)  # wq_b, 32 MB
    assert tile(1024, 4096, "fp8_block", False, (1, 1)) == (8, 1024)  # wq_a, 4 MB
    assert tile(1024, 4096, "fp8_block", False, (8, 8)) == (32, 512)  # wo_a: 8 groups of 4 MB
    assert tile(2048, 4096, "fp8_block", True, (1, 1)) == (8, 1024)  # shared expert gate+up: gated FP8
    assert tile(2048, 4096, "fp4_e2m1", True, (6, 6)) == (32, 512)  # six experts' gate+up, 50 MB
    assert tile(2048, 4096, "fp4_e2m1", True, (1, 1)) == (16, 512)  # one expert, 8 MB
    # the six experts' down projection (25 MB) in two-warp programs, gate+up in four (v15 run 2)
    down = dispatch.gemm_config(1, 4096, 2048, "fp4_e2m1", gated=False, active=(6, 6))
    up = dispatch.gemm_config(1, 2048, 4096, "fp4_e2m1", gated=True, active=(6, 6))
    assert (down.block_n, down.block_k, down.num_warps, up.num_warps) == (32, 512, 2, 4)


def test_mhc_launch_shapes_for_few_tokens(monkeypatch):
    """One token: the mixes in up to 128 K splits and the split kernel (Sinkhorn in its first block) in one-warp
    programs of 128 channels; from 65 tokens the four-warp rows of ``hc_post``."""
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "num_sms", lambda: 132)
    assert dispatch.hc_split_config(1, 4, 4096) == dispatch.HcRowsConfig(128, 1)
    assert dispatch.hc_split_config(64, 4, 4096).num_warps == 1
    assert dispatch.hc_split_config(65, 4, 4096) == dispatch.hc_rows_config(4, 4096)
    assert dispatch.hc_mixes_config(1, 4 * 4096, 24).splits == 128
    assert dispatch.hc_mixes_config(16, 4 * 4096, 24).splits == 64
    assert dispatch.hc_mixes_config(1024, 4 * 4096, 24).splits == 5  # 64 row tiles: 2 programs an SM
    # prefill: 128-row tiles, 32-deep steps (32 row tiles x 9 splits)
    assert dispatch.hc_mixes_config(4096, 4 * 4096, 24) == dispatch.HcMixesConfig(128, 32, 9, 4, 4)


def test_fused_mhc_boundary_for_few_tokens(monkeypatch):
    from deepinfer_cuda_sm100 import dispatch

    settings.use(settings.CudaSM100Settings(hc_fused=False))
    assert dispatch.hc_fused_config(1, 4, 4096, 24) is None  # the A/B switch
    settings.use(settings.CudaSM100Settings())
    one = dispatch.hc_fused_config(1, 4, 4096, 24)  # on by default (H200 v16)
    assert (one.block_d, one.num_warps) == (32, 4)  # 128 programs a token in launch 1
    assert (one.norm_block_d, one.norm_warps) == (128, 1)  # the split kernel's one-warp shape
    assert dispatch.hc_fused_config(2, 4, 4096, 24) == one
    assert (
        dispatch.hc_fused_config(3, 4, 4096, 24) is None and dispatch.hc_fused_config(0, 4, 4096, 24) is None
    )


def test_one_query_row_takes_the_small_decode_tile(monkeypatch):
    """Batch-1 decode (one row, split-KV) runs 16 heads x 32 slots a program, 8 warps, over every pool; from two
    rows every head of the token (up to 64) x 32 slots (H100 sweeps, RESULTS v31, v35, v36), which decodes each of
    V4's FP8 and V4.1's packed tiles once; plain rows past a decode batch (prefill chunks) 32 heads x 64 slots."""
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    for kind in ({}, {"fp8": True}, {"packed": True}):
        assert dispatch.attention_config(1, 64, 512, 640, **kind) == dispatch.AttentionConfig(16, 32, 8, 2)
    assert dispatch.attention_config(16, 64, 512, 640) == dispatch.AttentionConfig(64, 32, 8, 2)
    assert dispatch.attention_config(256, 64, 512, 640) == dispatch.AttentionConfig(64, 32, 8, 2)
    assert dispatch.attention_config(257, 64, 512, 640) == dispatch.AttentionConfig(32, 64, 8, 2)
    assert dispatch.attention_config(16, 64, 512, 640, fp8=True) == dispatch.AttentionConfig(64, 32, 8, 2)
    assert dispatch.attention_config(16, 64, 512, 640, packed=True) == dispatch.AttentionConfig(64, 32, 8, 1)
    assert dispatch.attention_config(16, 32, 512, 640, fp8=True).block_h == 32  # fewer heads: no wider tile
    # rows wider than 512 (1,024-wide tiles) take a tile that fits shared memory with float32 operands
    for t in (1, 3, 64):
        assert dispatch.attention_config(t, 16, 576, 40, fp8=True) == dispatch.AttentionConfig(16, 16, 8, 1)


def test_few_token_decode_splits_attention_and_long_compressor_windows(monkeypatch):
    """Split-KV attention and chunked compressor windows only while the unsplit programs fill under half the
    SMs; chunks are whole tiles, so never more than the slots (or rows) allow, and the programs fill whole waves
    (rounded down: 64 programs split 2 ways, 128, not 3 ways, 192 on 132 SMs)."""
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "num_sms", lambda: 132)
    assert dispatch.attention_splits(2, 640, 64) == 10  # batch 1: 2 head blocks, 10 tiles of slots
    assert dispatch.attention_splits(32, 640, 64) == 4  # batch 16: one program per SM, whole waves
    assert dispatch.attention_splits(64, 640, 32) == 2  # 64 rows of 64-head tiles: 128 programs, one wave
    assert dispatch.attention_splits(128, 640, 64) == 1  # batch 64: enough programs already
    assert dispatch.attention_splits(2, 64, 64) == 1  # one tile: nothing to split
    cfg = dispatch.compress_config(128, 512)
    assert dispatch.compress_splits(1, 128, cfg.block_l) == 128 // cfg.block_l  # HCA window at batch 1
    assert dispatch.compress_splits(1, 8, dispatch.compress_config(8, 512).block_l) == 1  # CSA: one block
    assert dispatch.compress_splits(100, 128, cfg.block_l) == 1


def test_fp4_ptx_decode_only_where_it_is_exact(monkeypatch):
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    assert dispatch.fp4_decode_ptx(torch.bfloat16, [(100, 128), (90, 120)])
    assert dispatch.fp4_decode_ptx(None, [(100, 128)])  # GEMV: any activation dtype
    assert not dispatch.fp4_decode_ptx(torch.float16, [(100, 128)])  # fp16 tiles would not hold the weights
    assert not dispatch.fp4_decode_ptx(torch.bfloat16, [(100, 129)])  # scale 4: scale * 2**126 overflows bf16
    assert not dispatch.fp4_decode_ptx(torch.bfloat16, [(100, 120), None])  # float32 scales
    monkeypatch.setattr(dispatch, "arch", lambda: "interpreter")
    assert not dispatch.fp4_decode_ptx(torch.bfloat16, [(100, 128)])


def test_fp8_prefill_gemm_goes_to_tilelang_only_where_it_was_run(monkeypatch):
    monkeypatch.setattr(dispatch, "tilelang_installed", lambda: True)
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    bf16 = torch.bfloat16
    assert dispatch.fp8_gemm_backend(8192, 4096, 8192, bf16) == "tilelang"
    assert dispatch.fp8_gemm_backend(8192, 4096, 8192, torch.float32) == "triton"  # bf16 WGMMA only
    assert dispatch.fp8_gemm_backend(8192, 4000, 8192, bf16) == "triton"  # N not whole 128-row scale blocks
    assert dispatch.fp8_gemm_backend(dispatch.TILELANG_MIN_ROWS - 1, 4096, 8192, bf16) == "triton"
    settings.use(settings.CudaSM100Settings(tilelang=False))
    assert dispatch.fp8_gemm_backend(8192, 4096, 8192, bf16) == "triton"
    settings.use(settings.CudaSM100Settings())
    monkeypatch.setattr(dispatch, "arch", lambda: "sm100")  # never run on SM100: stays on Triton
    assert dispatch.fp8_gemm_backend(8192, 4096, 8192, bf16) == "triton"
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "tilelang_installed", lambda: False)
    assert dispatch.fp8_gemm_backend(8192, 4096, 8192, bf16) == "triton"


def test_tilelang_kernel_lowers_to_wgmma_cuda_without_a_gpu():
    """Where tilelang (and nvcc) are installed, the kernel compiles for sm_90a here, no GPU needed."""
    pytest.importorskip("tilelang")
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from deepinfer_cuda_sm100.kernels import tl_fp8_gemm

    src = tl_fp8_gemm.source(256, 512)
    assert "wgmma" in src and "fp8_e4_t" in src


def test_indexer_select_kernel_choice(monkeypatch):
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "SELECT_KERNEL_ON_GPU", False)
    assert dispatch.indexer_select(2048) == "torch"
    monkeypatch.setattr(dispatch, "SELECT_KERNEL_ON_GPU", True)
    assert dispatch.indexer_select(2048) == "kernel"
    assert dispatch.indexer_select(dispatch.SELECT_MAX_COLUMNS + 1) == "torch"  # a row must fit one program
    monkeypatch.setattr(dispatch, "arch", lambda: "interpreter")
    monkeypatch.setattr(dispatch, "SELECT_KERNEL_ON_GPU", False)
    assert dispatch.indexer_select(2048) == "kernel"


def test_decode_gemv_steps_divide_v41_depths(monkeypatch):
    """V4.1's GEMM depths that 512 and 1,024 do not divide (wq_b's 1,280, the down projections' 2,304) get whole
    K steps of 256; V4's keep theirs."""
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "num_sms", lambda: 132)
    for k, fmt in ((1280, "fp8_block32"), (2304, "fp8_block32"), (2304, "fp4_e2m1")):
        cfg = dispatch.gemm_config(1, 5120, k, fmt, gated=False, active=(6, 6))
        assert cfg.gemv and cfg.block_k == 256 and k % cfg.block_k == 0, (k, fmt, cfg)
    assert dispatch.gemm_config(1, 4096, 2048, "fp4_e2m1", gated=False, active=(6, 6)).block_k == 512
    assert dispatch.gemm_config(1, 1024, 4096, "fp8_block", gated=False, active=(1, 1)).block_k == 1024
