"""Helpers shared by the slice benchmark's sections (``v4_slice.py``, ``mask_sections.py``): the run's results
and log, the ceilings measured at its start, the CUDA runtime, timing and the per-kernel profile of a step."""

from __future__ import annotations

import sys
import time

import torch

RESULTS: dict = {}
#: ``--smoke``: the slice section at toy sizes on the CPU reference backend (checks the scripts themselves)
SMOKE = "--smoke" in sys.argv


def log(*a) -> None:
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------- ceilings


def ceilings(dev) -> dict[str, float]:
    import triton

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50)
    copy_bw = 2 * n / (ms * 1e-3)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    ms = triton.testing.do_bench(lambda: x @ x, warmup=5, rep=50)
    mm = 2 * 8192**3 / (ms * 1e-3)
    a = b = x = None
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": copy_bw, "bf16_matmul_flops": mm}


# ----------------------------------------------------------------------------------------- runtime


def cuda_runtime(config):
    import deepinfer_cuda_sm100.plugin as cuda_plugin
    import deepinfer_spec_decode.plugin as spec_plugin
    import deepinfer_structured.plugin as structured_plugin
    from deepinfer_core.runtime import build_runtime

    return build_runtime(config, extra_plugins=[cuda_plugin, structured_plugin, spec_plugin])


def make_llm(path: str, backend: str, **kw):
    from cuda_settings import cuda_env

    from deepinfer_core.config import load_config
    from deepinfer_core.engine.llm import LLM
    from deepinfer_core.engine.llm_engine import LLMEngine

    config = load_config(
        environ=cuda_env() if backend == "cuda_sm100" else {}, model=path, backend=backend, **kw
    )
    rt = cuda_runtime(config) if backend == "cuda_sm100" else None
    return LLM.from_engine(LLMEngine.from_config(config, rt))


def time_variant(row: dict, launch, out: torch.Tensor, outs: dict, checked: bool) -> dict:
    """One kernel variant of the ``*_variants.py`` scripts: ``row`` with its time (``do_bench``, us), its largest
    difference from mode 0's output when ``checked``, or the error that kept it from compiling (a tile that does not
    fit is a finding); printed as a JSON line."""
    import json

    import triton

    try:
        launch()
        torch.cuda.synchronize()
        row["us"] = triton.testing.do_bench(launch, warmup=20, rep=100) * 1e3
        outs.setdefault(row["mode"], out)
        if checked and 0 in outs:
            row["max_diff_vs_plain"] = float((out - outs[0]).abs().max())
    except Exception as e:  # noqa: BLE001 - reported per variant
        row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
    print(json.dumps(row), flush=True)
    return row


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_call(fn, reps: int = 20) -> float:
    """Median milliseconds of ``fn`` (synchronised), after 3 warm-up calls."""
    if SMOKE:
        reps = 1
    for _ in range(1 if SMOKE else 3):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def step_sequence(prof, steps: int = 5) -> list[tuple[str, float]]:
    """The last profiled step's kernels in launch order with their microseconds (which layer op is slow)."""
    from torch.autograd import DeviceType

    kernels = sorted(
        (
            e
            for e in prof.events()
            if e.device_type == DeviceType.CUDA or (SMOKE and e.name.startswith("aten::"))
        ),
        key=lambda e: e.time_range.start,
    )
    per = len(kernels) // steps
    return [(e.name, round(e.time_range.elapsed_us(), 2)) for e in kernels[len(kernels) - per :]]


def profile_step(sr, batch: int, ctx: int, dev) -> dict:
    """GPU time per kernel of an eager decode step (the graph replays the same kernels back to back)."""
    from torch.profiler import ProfilerActivity, profile

    fb = sr.batch(batch, ctx, graph=False).to(dev)
    sr.runner.run(fb)
    sync()
    with profile(activities=[ProfilerActivity.CPU if SMOKE else ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            sr.runner.run(fb)
        sync()
    rows = sorted(
        (
            (e.key, (e.self_cpu_time_total if SMOKE else e.self_device_time_total) / 5 / 1e3, e.count // 5)
            for e in prof.key_averages()
        ),
        key=lambda r: -r[1],
    )
    total = sum(r[1] for r in rows)
    top = [{"kernel": k[:90], "ms": round(ms, 4), "calls": n} for k, ms, n in rows[:14]]
    log(f"profile batch {batch} ctx {ctx}: kernel time {total:.3f} ms per step")
    for r in top:
        log("   ", r)
    most = sorted(rows, key=lambda r: -r[2])[:25]  # where the launches are (what fusing would remove)
    by_calls = [{"kernel": k[:90], "calls": n, "ms": round(ms, 4)} for k, ms, n in most]
    log("  by launches:", by_calls)
    seq = step_sequence(prof)
    log(f"  one step in launch order ({len(seq)} kernels; name, us):")
    for i in range(0, len(seq), 6):
        log("    " + " | ".join(f"{k[:28]} {us:.1f}" for k, us in seq[i : i + 6]))
    return {
        "sequence": seq,
        "kernel_ms_per_step": total,
        "launches_per_step": sum(r[2] for r in rows),
        "top": top,
        "by_calls": by_calls,
    }
