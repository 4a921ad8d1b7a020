"""Launch configurations of the grouped GEMM at decode sizes (few rows per weight), on the GPU.

A decode step of the V4-Flash slice spends 81% (batch 1) to 94% (batch 64) of its kernel time in
``_grouped_gemm_kernel`` (``v4_slice.py --profile``): the FP8 attention projections and the FP4 routed
experts, with 1-32 rows per weight. Memory-bound there, so each configuration is reported as achieved
weight bytes per second against the copy bandwidth measured in the same run.

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python benchmarks/gpu/decode_gemm_sweep.py
"""

# ruff: noqa: B023 - every lambda is called before its loop variables change
from __future__ import annotations

import torch
import triton

from deepinfer_core.ops.quant_formats import FP8_BLOCK
from deepinfer_core.ops.weights import ExpertWeights, QuantizedWeight
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

DEV = torch.device("cuda")
CONFIGS = [  # (block_m, block_n, block_k, warps, stages, split_k)
    (64, 64, 64, 4, 4, 1),  # FP8 at decode before split-K
    (16, 64, 64, 4, 3, 1),  # FP4 at decode before split-K
    (64, 64, 64, 4, 4, 4),
    (64, 64, 64, 4, 4, 8),
    (16, 64, 128, 4, 4, 1),
    (16, 64, 128, 4, 4, 4),
    (16, 32, 128, 4, 4, 4),
    (16, 32, 128, 4, 4, 8),
    (16, 64, 64, 4, 3, 4),
    (16, 16, 128, 2, 4, 8),
]


def fp8(n: int, k: int) -> QuantizedWeight:
    data = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn)
    scale = torch.full((-(-n // FP8_BLOCK), -(-k // FP8_BLOCK)), k**-0.5, device=DEV)
    return QuantizedWeight(data, scale, "fp8_block", (n, k))


def fp4(n: int, k: int) -> QuantizedWeight:
    data = torch.randint(0, 256, (n, k // 2), device=DEV, dtype=torch.uint8)
    scale = torch.full((n, k // 32), 2.0**-7, device=DEV)
    return QuantizedWeight(data, scale, "fp4_e2m1", (n, k))


def nbytes(w: QuantizedWeight) -> int:
    return w.data.numel() * w.data.element_size() + w.scale.numel() * w.scale.element_size()


def main() -> None:
    n = 1 << 30
    a, b = torch.empty(n, dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
    copy_bw = 2 * n / (triton.testing.do_bench(lambda: b.copy_(a)) * 1e-3)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    orig = dispatch.gemm_config
    print("default decode choices:", orig(1, 1024, 4096, "fp8_block", False, active=(1, 1)),
          orig(6 / 256, 2048, 4096, "fp4_e2m1", True, active=(6, 6)), flush=True)  # fmt: skip
    dense = CudaDenseOps()
    best: dict[str, tuple] = {}
    for name, (nn, kk) in {
        "wq_a / wo_a group 1024x4096": (1024, 4096),
        "wo_b 4096x8192": (4096, 8192),
    }.items():
        w = fp8(nn, kk)
        for m in (1,):
            x = torch.randn(m, kk, device=DEV, dtype=torch.bfloat16)
            for c in CONFIGS:
                dispatch.gemm_config = lambda *a, c=c, **k: dispatch.GemmConfig(*c)
                dense._tables = type(dense._tables)()
                try:
                    ms = triton.testing.do_bench(lambda: dense.linear(x, w))
                except Exception as e:  # noqa: BLE001 - a config that does not compile is a result too
                    print(f"fp8 {name} M={m} {c}: failed {type(e).__name__}", flush=True)
                    continue
                pct = 100 * nbytes(w) / (ms * 1e-3) / copy_bw
                print(f"fp8 {name} M={m} cfg={c}: {ms * 1e3:.1f} us, {pct:.0f}% of copy bw", flush=True)
                key = f"fp8 M={m}"
                best.setdefault(key, {}).setdefault(c, []).append(pct)
    moe = CudaMoEOps()
    E, INTER, H, K = 256, 2048, 4096, 6
    ew = ExpertWeights(
        [fp4(INTER, H) for _ in range(E)],
        [fp4(INTER, H) for _ in range(E)],
        [fp4(H, INTER) for _ in range(E)],
        list(range(E)),
    )
    per_expert = nbytes(ew.w1[0]) * 3
    bias = torch.zeros(E, device=DEV)
    for t in (1, 16):
        x = torch.randn(t, H, device=DEV, dtype=torch.bfloat16)
        wts, ids = moe.route_topk(torch.randn(t, E, device=DEV), bias, K, "sqrtsoftplus", 1.5)
        touched = int(torch.unique(ids).numel())
        for c in CONFIGS:
            dispatch.gemm_config = lambda *a, c=c, **k: dispatch.GemmConfig(*c)
            moe._prepared = type(moe._prepared)()
            try:
                ms = triton.testing.do_bench(lambda: moe.experts(x, ids, wts, ew, 10.0))
            except Exception as e:  # noqa: BLE001
                print(f"fp4 experts T={t} {c}: failed {type(e).__name__}", flush=True)
                continue
            pct = 100 * touched * per_expert / (ms * 1e-3) / copy_bw
            print(
                f"fp4 experts T={t} ({touched} experts) cfg={c}: {ms * 1e3:.1f} us, {pct:.0f}% of copy bw",
                flush=True,
            )
            best.setdefault(f"fp4 T={t}", {}).setdefault(c, []).append(pct)
    dispatch.gemm_config = orig
    for key, by_cfg in best.items():
        ranked = sorted(by_cfg.items(), key=lambda kv: -sum(kv[1]) / len(kv[1]))
        print(f"best {key}: " + "; ".join(f"{c} {sum(v) / len(v):.0f}%" for c, v in ranked[:3]), flush=True)


if __name__ == "__main__":
    main()
