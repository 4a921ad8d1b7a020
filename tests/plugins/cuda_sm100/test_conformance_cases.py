"""The core's conformance cases (deepinfer_core.testing) run on the cuda_sm100 op objects.

The kit resolves a platform through its availability probe, which needs a GPU; here the op objects
are handed to ``check_case`` directly, on the test device (the interpreter on a CPU)."""

from __future__ import annotations

import types

import pytest

from deepinfer_core.testing.kit import all_cases, check_case

from .cuda_sm100_helpers import DEVICE, needs_triton

pytestmark = needs_triton
#: one process: the two-process cases need a gloo group, and the CUDA plugin's collectives are NCCL
CASES = [c for c in all_cases() if c.concern in ("dense", "attention", "moe", "sampling") and c.world == 1]


@pytest.fixture(scope="module")
def backends():
    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps
    from deepinfer_cuda_sm100.ops.comm import NcclCommOps
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps
    from deepinfer_cuda_sm100.ops.sampling import CudaSamplingOps

    return types.SimpleNamespace(
        dense=CudaDenseOps(), attention=CudaAttentionOps(), moe=CudaMoEOps(), sampling=CudaSamplingOps(),
        memory=types.SimpleNamespace(device=DEVICE), comm=NcclCommOps(),
    )  # fmt: skip


def test_cases_exist():
    assert len(CASES) >= 10


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_conformance_case(backends, case):
    assert case.applies_to(backends)  # the plugin declares every optional feature the cases test
    check_case(backends, case)


def test_the_plugin_declares_its_fused_kernels(backends):
    """Every fusion the core knows has a kernel here, so the model's fused steps are this plugin's methods."""
    from deepinfer_core.ops.fusions import Fusion, resolve_fusions

    fused = resolve_fusions(backends.dense, backends.attention)
    assert fused.declared == set(Fusion)
    assert (
        fused.hc_post_pre == backends.dense.hc_post_pre
        and fused.indexer_select == backends.attention.indexer_select
    )
