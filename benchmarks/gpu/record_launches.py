"""Record every CUDA-plugin kernel launch of the V4-Flash slice on the GPU: the SM100 compile manifest.

Runs ``v4_slice.py`` (greedy engine runs, graphed and eager decode at several batches, prefill, BF16 and FP8
KV) and ``mtp_steps.py`` (MTP verify and draft steps) under ``launch_manifest.record``, and writes each
distinct launch (kernel, argument types, constexpr values, warps, stages) to ``$OUT/launches.json``. The CI test
``tests/plugins/cuda_sm100/test_sm100_compile.py`` compiles every entry for ``sm_100a`` on the CPU. Timings of
this run are meaningless (the recorder sits on every launch).

    run (carry [".whl"]):  python3 benchmarks/gpu/record_launches.py [v41]

``v41``: instead, V4.1 on the plugin (``v41_greedy.py``: float32, eager and graphed, DSpark k = 3, with
unquantized KV and with the trained FP8 / FP4 cache), which launches the V4.1 paths (FP8 32 x 32 weights, single-pass mHC, packed KV) at
the tiny checkpoints' shapes; its entries are added to the manifest's.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "tests" / "plugins" / "cuda_sm100")]

import launch_manifest  # noqa: E402


def _run(module_name: str, argv: list[str]) -> str:
    import importlib

    mod = importlib.import_module(module_name)
    old = sys.argv
    sys.argv = [module_name, *argv]
    t0 = time.perf_counter()
    try:
        mod.main()
        return f"ok in {time.perf_counter() - t0:.0f} s"
    except BaseException as e:  # noqa: BLE001 - record what ran and report the rest
        return f"{type(e).__name__}: {e}"[:300]
    finally:
        sys.argv = old


def main() -> None:
    import torch
    import triton

    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    store: dict = {}
    runs = {}
    parts = [
        (
            "v4_slice",
            [
                "--sections",
                "greedy",
                "slice",
                "--batches",
                "1",
                "2",
                "16",
                "64",
                "256",
                "--contexts",
                "4096",
                "--prefill",
                "8192",
                "--out",
                str(out / "slice"),
            ],
        ),
        (
            "v4_slice",
            [
                "--sections",
                "slice",
                "--batches",
                "1",
                "16",
                "256",
                "--contexts",
                "4096",
                "--prefill",
                "2048",
                "--kv-cache-dtype",
                "fp8",
                "--out",
                str(out / "slice_fp8"),
            ],
        ),
        (
            "mtp_steps",
            ["--sections", "steps", "--batches", "1", "16", "--ks", "1", "3", "--out", str(out / "mtp")],
        ),
    ]
    if sys.argv[1:] == ["v41"]:
        parts = [
            ("v41_greedy", ["--modes", "eager", "graphs", "--configs", "flash_mini", "--dspark", "3", "--out",
                            str(out / "v41_exact")]),
            ("v41_greedy", ["--modes", "eager", "graphs", "--configs", "reindex_r2", "--kv", "auto", "--dspark", "3",
                            "--out", str(out / "v41_auto")]),
        ]  # fmt: skip
    with launch_manifest.record(store):
        for name, argv in parts:
            key = f"{name} {' '.join(argv)}"
            runs[key] = _run(name, argv)
            print(key, "->", runs[key], f"({len(store)} entries so far)", flush=True)
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "runs": runs,
    }
    entries = sorted(store.values(), key=lambda e: json.dumps(e, sort_keys=True))
    (out / "launches.json").write_text(json.dumps({"meta": meta, "entries": entries}, indent=1) + "\n")
    print(
        f"{len(entries)} distinct launches of {len({(e['module'], e.get('kernel')) for e in entries})} kernels"
    )


if __name__ == "__main__":
    main()
