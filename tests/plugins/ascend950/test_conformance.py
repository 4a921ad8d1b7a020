"""The core's conformance kit for ascend950 under the torch_npu stand-in (ops' device mapped to cpu by
the stand-in): every case of ``deepinfer_core.testing.all_cases()``, with the default switches and with
every fused path on. This checks the plugin against the reference ops through the stand-in, not the
Ascend kernels."""

from __future__ import annotations

import pytest

from deepinfer_core.testing import all_cases, backends_for, check_case

CASES = all_cases()


@pytest.mark.parametrize("switches", ["default", "all"])
def test_conformance_kit_passes_for_ascend950(standin, monkeypatch, switches):
    if switches == "all":
        monkeypatch.setenv("DEEPINFER_ASCEND950__FUSED", "all")
    backends = backends_for("ascend950")
    assert backends.memory.device.type == "cpu"
    failures = []
    for case in CASES:
        if not case.applies_to(backends):
            continue
        try:
            check_case(backends, case)
        except AssertionError as e:
            failures.append(f"{case.id}: {e}")
    assert not failures, "\n".join(failures)
    assert CASES, "the kit has no cases"
    # what ascend950 does not declare: the FP8 KV cache (docs/platforms/ascend950.md) and graph capture
    # (MemoryOps.supports_graphs); and what needs its collectives between processes (HCCL, not gloo)
    skipped = {c.id for c in CASES if c.kv_cache_dtype == "fp8" or c.op == "capture_graph" or c.world > 1}
    skipped.add("attention.indexer_topk_slots[v41_fp4_keys]")  # nor V4.1's packed KV (AttentionOps.packed_kv)
    assert {c.id for c in CASES if not c.applies_to(backends)} == skipped
    assert "attention.sparse_attention[fp8_kv_cache]" in skipped
