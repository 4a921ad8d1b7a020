"""Kernel tests run compiled on a CUDA GPU, else under Triton's CPU interpreter (``TRITON_INTERPRET=1``).

The interpreter flag is read when a ``@triton.jit`` function is defined, so it is set here, before
any kernel module is imported.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def default_cuda_settings():
    """Every test starts and ends with the default ``cuda_sm100`` settings (they are process-wide)."""
    from deepinfer_cuda_sm100 import settings

    settings.use(settings.CudaSM100Settings())
    yield
    settings.use(settings.CudaSM100Settings())


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(20261202)


@pytest.fixture(params=["tensor_cores", "tensor_cores_arith", "gemv"])
def gemm_kind(request, monkeypatch):
    """Force every grouped GEMM onto one kernel: the tensor-core tiles (FP4 decoded by bit placement, or
    by integer arithmetic), or the CUDA-core GEMV (decode)."""
    from dataclasses import replace

    from deepinfer_cuda_sm100 import dispatch

    orig = dispatch.gemm_config

    def forced(rows, n, k, fmt, gated, active=None):
        cfg = orig(rows, n, k, fmt, gated, active)
        if request.param == "gemv":
            return replace(dispatch.gemv_config(min(rows, 8), fmt), split_k=cfg.split_k)
        if cfg.gemv:
            cfg = replace(cfg, gemv=False, block_m=16, block_n=32, block_k=64)
        kind = request.param
        return replace(cfg, fp4_bits=kind != "tensor_cores_arith")

    monkeypatch.setattr(dispatch, "gemm_config", forced)
    return request.param
