"""Shared part of the GPU kernel checks (``check.py``, ``check_attention.py``): V4-Flash sizes, random inputs,
the error measure, timing (``bench``; ``bench_graph`` inside a CUDA graph), the ceilings and the results table."""

# ruff: noqa: B023 - every lambda here is called before its loop variables change
from __future__ import annotations

import json
import os
import sys
import time

SMOKE = "--smoke" in sys.argv  # tiny sizes on the CPU under TRITON_INTERPRET=1: checks this script itself
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

DEV = torch.device("cpu" if SMOKE else "cuda")
BF16, F32 = torch.bfloat16, torch.float32
BOUND = {"bf16": 1e-2, "f32": 1e-3}
# V4-Flash
HIDDEN, HEADS, HEAD_DIM, ROPE_DIM, Q_LORA, O_LORA, O_GROUPS = 4096, 64, 512, 64, 1024, 1024, 8
EXPERTS, INTER, TOPK = 256, 2048, 6
IDX_HEADS, IDX_DIM, IDX_TOPK, WINDOW, HC, VOCAB = 64, 128, 512, 128, 4, 129280
if SMOKE:
    HIDDEN, HEADS, HEAD_DIM, ROPE_DIM, EXPERTS, INTER, TOPK = 128, 4, 64, 16, 8, 64, 2
    IDX_HEADS, IDX_DIM, IDX_TOPK, WINDOW, VOCAB = 4, 32, 8, 8, 1000

ROWS: list[dict] = []
CEIL: dict[str, float] = {}
G = torch.Generator(DEV)


def sizes(*real):
    """The sizes to run: the real ones, or tiny stand-ins (same count, first one kept as the check size)."""
    return real if not SMOKE else tuple(min(v, 16 if i == 0 else 24) for i, v in enumerate(real))


def rnd(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, generator=G, device=DEV) * scale).to(dtype)


def rel_err(a, r) -> float:
    a, r = a.detach().double().cpu(), r.detach().double().cpu()
    if a.shape != r.shape or torch.isnan(a).any():
        return float("inf")
    return float((a - r).norm() / r.norm().clamp_min(1e-30))


def bench(fn) -> float:
    """Median milliseconds."""
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_graph(fn, calls: int = 20) -> float:
    """Median milliseconds of one ``fn`` call replayed inside a CUDA graph of ``calls`` calls: the kernel time
    a decode step sees, without the host's launch cost (which ``bench`` includes for kernels of a few us)."""
    if SMOKE:
        return bench(fn)
    from deepinfer_cuda_sm100.kernels import side_branch

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
        side_branch.join(DEV)  # a side branch (mHC's coefficients) must be joined before the capture ends
    return bench(g.replay) / calls


def record(name, shape, err=None, bound=None, ms=None, nbytes=0.0, flops=0.0, note=""):
    floor = max(nbytes / CEIL["bw"], flops / CEIL["flops"]) * 1e3 if ms is not None else None
    row = {"kernel": name, "shape": shape, "rel_err": err, "bound": bound,
           "ok": None if err is None else bool(err < bound), "us": None if ms is None else ms * 1e3,
           "floor_us": None if floor is None else floor * 1e3, "GB/s": nbytes / ms / 1e6 if ms else None,
           "TFLOP/s": flops / ms / 1e9 if ms else None, "note": note}  # fmt: skip
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def ceilings():
    x = torch.empty(1 << (31 if not SMOKE else 20), dtype=torch.uint8, device=DEV).random_(
        0, 255, generator=G
    )
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    CEIL["bw"] = 2 * x.numel() / ms * 1e3  # bytes/s, read + write
    n = 8192 if not SMOKE else 256
    a, b = rnd(n, n), rnd(n, n)
    ms = bench(lambda: a @ b)
    CEIL["flops"] = 2 * n**3 / ms * 1e3
    print(
        f"ceilings: copy {CEIL['bw'] / 1e12:.2f} TB/s, bf16 matmul {CEIL['flops'] / 1e12:.0f} TFLOP/s",
        flush=True,
    )


def poisoned(fn):
    """Run ``fn`` after filling the caching allocator's free blocks with NaN (unwritten outputs show)."""
    junk = torch.full((1 << (28 if not SMOKE else 10),), float("nan"), device=DEV)
    del junk
    return fn()


def table() -> str:
    lines = ["| kernel | shape | rel err | bound | ok | time us | floor us | floor/time | GB/s | TFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in ROWS:
        f = lambda v, s: "" if v is None else s.format(v)  # noqa: E731
        eff = f(None if not r["us"] else r["floor_us"] / r["us"], "{:.0%}")
        lines.append(f"| {r['kernel']} | {r['shape']} | {f(r['rel_err'], '{:.2e}')} | {f(r['bound'], '{:.0e}')} | "
                     f"{'' if r['ok'] is None else ('yes' if r['ok'] else 'NO')} | {f(r['us'], '{:.1f}')} | "
                     f"{f(r['floor_us'], '{:.1f}')} | {eff} | {f(r['GB/s'], '{:.0f}')} | {f(r['TFLOP/s'], '{:.1f}')} |")  # fmt: skip
    return "\n".join(lines)
