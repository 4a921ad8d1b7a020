"""Host time to plan one decode step of the V4-Flash-shaped slice's layer kinds (sliding, CSA 4, HCA 128),
dynamic vs static (graph) mode, on the CPU: what ``ModelRunner.prepare`` pays per step before the copy.

    python benchmarks/plan_cost.py

Static mode builds the candidate tables in ``StepAddressing.to`` on the device; here ``to()`` runs on the
CPU too, and its time is shown separately (on a GPU it is a few elementwise kernels).
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu")]
import slice_model as sm  # noqa: E402

from deepinfer_core.config import load_config  # noqa: E402
from deepinfer_core.runtime import build_runtime  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    rt = build_runtime(load_config(environ={}, backend="reference"))
    # toy widths: planning cost depends on the layer kinds, batch and context, not on the widths
    sr = sm.SliceRunner(sm.build_slice(4, rt.backends, toy=True), rt.backends, 256, 32768, graphs=True)
    print(f"# {os.cpu_count()} CPUs, torch {torch.__version__}, 1 thread; median of 5")
    print("| batch | context | mode | plan ms | to() ms | tables MB |")
    print("|---|---|---|---|---|---|")
    for b, ctx in ((1, 4096), (32, 4096), (256, 4096), (32, 32768), (256, 32768)):
        for static in (False, True):
            plans, tos = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                fb = sr.batch(b, ctx, graph=static)
                t1 = time.perf_counter()
                moved = fb.to(torch.device("cpu"))
                plans.append(t1 - t0)
                tos.append(time.perf_counter() - t1)
            mb = sum(t.numel() * t.element_size() for t in moved.plan.tensors()) / 1e6
            mode = "static" if static else "dynamic"
            print(
                f"| {b} | {ctx // 1024}k | {mode} | {sorted(plans)[2] * 1e3:.1f} | {sorted(tos)[2] * 1e3:.1f} | {mb:.1f} |"
            )


if __name__ == "__main__":
    main()
