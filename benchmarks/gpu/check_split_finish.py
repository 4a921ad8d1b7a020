"""Split-K finished by each tile's last K slice (``GemmConfig.split_finish``, NOTES.md v13) against the epilogue
launch, on the GPU: the outputs must be bitwise equal (both sum the partials in slice order) on every one of
``CALLS`` calls, where the slices of a tile really run concurrently; then each way's time in a CUDA graph.

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python benchmarks/gpu/check_split_finish.py [--out DIR]
"""

# ruff: noqa: B023 - every lambda is called before its loop variables change
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from gemm_kernels import DEV, G, fp4, fp8, graph_ms

from deepinfer_core.ops.weights import ExpertWeights
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import arrival_counters
from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

CALLS = 200


def cases():
    dense, moe = CudaDenseOps(), CudaMoEOps()
    for rows in (1, 4):
        x = torch.randn(rows, 8192, device=DEV, generator=G).to(torch.bfloat16)
        for name, (n, k) in {"wq_a 1024x4096": (1024, 4096), "wkv 512x4096": (512, 4096),
                             "wo_b 4096x8192": (4096, 8192)}.items():  # fmt: skip
            w = fp8(n, k)
            yield f"fp8 linear {name}", rows, lambda w=w, x=x[:, :k].contiguous(): dense.linear(x, w)
        w1, w3, w2 = fp8(2048, 4096), fp8(2048, 4096), fp8(4096, 2048)
        xs = x[:, :4096].contiguous()
        yield "fp8 shared expert 2048x4096", rows, lambda: dense.swiglu_mlp(xs, w1, w3, w2, 10.0)
    E = 64
    ew = ExpertWeights([fp4(2048, 4096) for _ in range(E)], [fp4(2048, 4096) for _ in range(E)],
                       [fp4(4096, 2048) for _ in range(E)], list(range(E)))  # fmt: skip
    for t in (16, 64):
        x = torch.randn(t, 4096, device=DEV, generator=G).to(torch.bfloat16)
        w, ids = moe.route_topk(torch.randn(t, E, device=DEV, generator=G), None, 6, "sqrtsoftplus", 1.5)
        yield (
            "fp4 experts 64x(2048x4096) top-6",
            t,
            lambda x=x, w=w, ids=ids: moe.experts(x, ids, w, ew, 10.0),
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": torch.cuda.get_device_name()}, flush=True)
    orig = dispatch.gemm_config
    rows_out, bad = [], 0
    for op, rows, fn in cases():
        row = {"op": op, "rows": rows}
        try:
            dispatch.gemm_config = lambda *a, **k: replace(orig(*a, **k), split_finish=False)
            want = fn().clone()
            row["epilogue_us"] = graph_ms(lambda i: fn()) * 1e3
            dispatch.gemm_config = lambda *a, **k: replace(orig(*a, **k), split_finish=True)
            same = sum(bool(torch.equal(fn(), want)) for _ in range(CALLS))
            row["finish_us"] = graph_ms(lambda i: fn()) * 1e3
            row["equal_calls"] = f"{same}/{CALLS}"
            row["after_graph_equal"] = bool(torch.equal(fn(), want))
            row["counters_zero"] = not bool(arrival_counters(DEV).any())
            bad += same != CALLS or not row["after_graph_equal"] or not row["counters_zero"]
        except Exception as exc:  # noqa: BLE001 - report and go on to the next case
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            bad += 1
        finally:
            dispatch.gemm_config = orig
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    print("ALL EQUAL" if not bad else f"{bad} CASES FAILED", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "check_split_finish.json").write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
