"""The ``cuda_sm100`` section: each switch of the kernels is a typed setting, settable by argument,
``DEEPINFER_CUDA_SM100__*`` variable and config file, and reaches the dispatch decision it steers once the
platform is finalized for an engine (no GPU needed: the decisions are pure Python)."""

from __future__ import annotations

import json

import pytest
import torch

from deepinfer_core.config import load_config
from deepinfer_core.platforms.settings import bind_settings
from deepinfer_core.runtime import build_registry
from deepinfer_cuda_sm100 import dispatch, settings
from deepinfer_cuda_sm100.kernels import _common
from deepinfer_cuda_sm100.platform import CudaSM100Platform


def _on_hopper(monkeypatch):
    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    monkeypatch.setattr(dispatch, "tilelang_installed", lambda: True)


GEMV = dispatch.GemmConfig(1, 16, 512, 4, 1, gemv=True)
#: each setting, its non-default value, and the decision it changes: (value with default, with the setting)
DECISIONS = {
    "pdl": (False, lambda: dispatch.pdl_args(1) != {} or _common.gdc_wait is None),
    "hc_fused": (False, lambda: dispatch.hc_fused_config(1, 4, 4096, 24) is not None),
    "splitk_finish": (
        True,
        lambda: not dispatch.split_finish(dispatch.GemmConfig(16, 32, 64, 4, 1, split_k=4)),
    ),
    "fp4_h2": (False, lambda: dispatch.fp4_h2_mode(GEMV, True, torch.bfloat16, True) != 0),
    "tilelang": (False, lambda: dispatch.fp8_gemm_backend(8192, 4096, 8192, torch.bfloat16) == "tilelang"),
    "mx_gemm": (False, lambda: _on_sm100(lambda: dispatch.mx_gemm_config(256, 32) is not None)),
    "fp8_mma": (True, lambda: dispatch.mx_gemm_config(256, 32) is None),
    "graphed_probs": (False, lambda: dispatch.graphed_probs()),
    "radix_probs": (False, lambda: dispatch.radix_probs()),
    "probs_compact_first": (False, lambda: dispatch.probs_compact_first()),
    "fp8_kv_rope_apart": (True, lambda: dispatch.fp8_kv_mode() == 1),
    "dequant_gemm_rows": (0, lambda: dispatch.dequant_gemm(8192, torch.bfloat16)),
    "prefill_swap_ab": (True, lambda: not dispatch.gemm_config(192, 2048, 4096, "fp4_e2m1", True).swap_ab),
    "fp4_prefill_block_k": (
        64,
        lambda: dispatch.gemm_config(192, 2048, 4096, "fp4_e2m1", True).block_k == 128,
    ),
}


def _on_sm100(decide):
    """``decide()`` with the dispatch seeing SM100 (the MX GEMM is an SM100 path), then the arch as it was."""
    arch = dispatch.arch
    dispatch.arch = lambda: "sm100"
    try:
        return decide()
    finally:
        dispatch.arch = arch


def _config(route: str, field: str, value: bool | int, tmp_path):
    if route == "argument":
        return load_config(environ={}, cuda_sm100={field: value})
    if route == "environment":
        text = str(value) if type(value) is int else "1" if value else "0"
        return load_config(environ={f"DEEPINFER_CUDA_SM100__{field.upper()}": text})
    (tmp_path / "engine.toml").write_text(f"[cuda_sm100]\n{field} = {json.dumps(value)}\n")
    return load_config(tmp_path / "engine.toml", environ={})


@pytest.mark.parametrize("route", ["argument", "environment", "config file"])
@pytest.mark.parametrize("field", list(DECISIONS))
def test_each_setting_reaches_its_dispatch_decision_by_every_route(monkeypatch, tmp_path, route, field):
    _on_hopper(monkeypatch)
    value, default_decision = DECISIONS[field]
    assert default_decision(), f"{field}: the default setting should take the default path"
    cfg = bind_settings(_config(route, field, value, tmp_path), build_registry().platforms)
    CudaSM100Platform().finalize(None, cfg)
    assert getattr(settings.active(), field) == value and type(getattr(settings.active(), field)) is type(
        value
    )
    if field != "pdl" or _common.gdc_wait is not None:  # without griddepcontrol PDL is off either way
        assert not default_decision(), f"{field}={value} did not change its decision"


def test_defaults_are_the_measured_choices():
    """The measured choices (benchmarks/gpu/NOTES.md), with one not measured: ``mx_gemm`` on (no SM100 was
    reachable; the only SM100 path for the release's FP8 activations that uses the MX MMA); ``graphed_probs`` on
    as measured on an H100 (RESULTS v29); ``fp8_mma`` off as measured (8-12% of the BF16 matmul rate, v25);
    ``fp8_kv_scale_gather`` off as measured on an H100 (v29, v39: 2.2x slower at 64 rows); ``radix_select`` off as measured (v33: slower in the step); ``hc_side_coeffs`` on as measured (v35: a V4.1 layer faster, the same tokens);
    ``probs_compact_first`` on as measured on an H100 (v37: the sampler's probs at 256 rows 1.02 -> 0.62 ms);
    ``fp8_kv_rope_apart`` off: slower on an H100 (v39); ``dequant_gemm_rows`` 1024 as measured on an H100 (v41: V4's 8k
    prefill 7% shorter, three processes each way); ``prefill_swap_ab`` off: its tiles slower on an H100 (v41);
    ``fp4_prefill_block_k`` 128 as measured on an H100 (v42: V4's 8k prefill 8% shorter, three processes each way)."""
    assert settings.CudaSM100Settings().model_dump() == {
        "pdl": True, "hc_fused": True, "hc_side_coeffs": True, "splitk_finish": False, "fp4_h2": True, "mx_gemm": True, "fp8_mma": False,
        "tilelang": True, "graphed_probs": True, "radix_probs": True, "probs_compact_first": True, "radix_select": False,
        "fp8_kv_scale_gather": False, "fp8_kv_rope_apart": False, "dequant_gemm_rows": 1024,
        "prefill_swap_ab": False, "fp4_prefill_block_k": 128,
    }  # fmt: skip
