"""``benchmarks/gpu/v41_reference_peer.py`` (DeepSeek's V4.1 reference on the slice, issue #27) builds the
reference from the same tensors and config as ``v41_slice.py``: at the demo's widths on the CPU, the reference
with float32 GEMMs and the release's KV formats (``kvq_only``) gives the engine's greedy tokens, every one.
Needs the reference folder (``DEEPINFER_V41_REFERENCE``, docs/v41_reference.md); skipped without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


@pytest.mark.skipif(not os.environ.get("DEEPINFER_V41_REFERENCE"), reason="DEEPINFER_V41_REFERENCE not set")
def test_the_reference_peer_reads_the_slice_s_weights_as_the_engine_does(tmp_path):
    def run(script: str, *argv: str) -> None:
        subprocess.run([sys.executable, script, *argv], cwd=GPU, check=True, capture_output=True, timeout=900)

    run("v41_slice.py", "--smoke", "--batches", "1", "3", "--ks", "0", "--tokens", "6", "--save-tokens",
        "--out", str(tmp_path / "engine"))  # fmt: skip
    run("v41_reference_peer.py", "--smoke", "--reference", os.environ["DEEPINFER_V41_REFERENCE"], "--batches",
        "1", "3", "--tokens", "6", "--modes", "kvq_only", "--engine-json",
        str(tmp_path / "engine" / "v41_slice.json"), "--out", str(tmp_path / "peer"))  # fmt: skip
    rows = json.loads((tmp_path / "peer" / "v41_reference_peer.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["agreement"] == {"prefix_share": 1.0, "equal_share": 1.0, "tokens": 6 * r["batch"]}
