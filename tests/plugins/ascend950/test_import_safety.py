"""Installing deepinfer-ascend950 on a machine without torch_npu changes nothing else: importing the
plugin module, or building the registry, imports neither torch_npu nor the op modules."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import json, sys, time
import deepinfer_core.config, deepinfer_core.plugins.registry  # what any engine imports before plugins
before = set(sys.modules)
t0 = time.perf_counter()
import deepinfer_ascend950.plugin
seconds = time.perf_counter() - t0
added = sorted(set(sys.modules) - before)
from deepinfer_core.plugins.registry import select_platform
from deepinfer_core.runtime import build_registry
reg = build_registry()
avail = reg.availability()["ascend950"]
auto = select_platform(reg, "auto").name
print(json.dumps({"added": added, "seconds": seconds, "after_registry": sorted(
    m for m in sys.modules if m.startswith(("torch_npu", "deepinfer_ascend950.ops"))),
    "reason": avail.reason, "auto": auto}))
"""


def run_probe() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_plugin_imports_only_its_own_light_modules():
    """The import cost is the plugin's own three small modules and the plugin API's name table, whose names
    load on first use (time is printed, not asserted: docs/platforms/ascend950.md records a measurement)."""
    res = run_probe()
    assert set(res["added"]) <= {
        "deepinfer_ascend950",
        "deepinfer_ascend950.plugin",
        "deepinfer_ascend950.platform",
        "deepinfer_core.plugin_api",
    }
    print(f"import deepinfer_ascend950.plugin: {res['seconds'] * 1e3:.2f} ms")


def test_registry_without_torch_npu_loads_no_op_module_and_stays_on_reference():
    res = run_probe()
    assert res["after_registry"] == [], "only the availability probe may try torch_npu, and it is absent here"
    assert res["reason"].startswith("torch_npu is not importable")
    assert res["auto"] != "ascend950"
