"""Where a slice's GPU time goes: graph replays timed alone, kernels by name over a replayed graph or one call
(with the GPU's idle gaps and the host operator before each), the torch operators of a step by the line that
issued them, and a cProfile of the host. Shared by the slice benchmarks (``v41_slice.py``)."""

from __future__ import annotations

import io
import pstats
import time
from collections import defaultdict

import torch
from bench_common import SMOKE, log, sync


def replay_ms(runner, match) -> dict[str, float]:
    """Median ms of each captured graph whose key ``match`` accepts, replayed alone (20 times)."""
    out = {}
    for key in list(runner.graphs):
        if not match(key):
            continue
        step = runner.graphs.steps[key]
        for _ in range(3):
            step.replay()
        sync()
        ts = []
        for _ in range(1 if SMOKE else 20):
            t0 = time.perf_counter()
            step.replay()
            sync()
            ts.append((time.perf_counter() - t0) * 1e3)
        out[str(key)] = sorted(ts)[len(ts) // 2]
    return out


def profile_graph(runner, batch: int) -> list[dict]:
    """GPU time per kernel name over 3 replays of the plain decode graph of ``batch`` rows (largest context
    bucket): where a V4.1 step spends its time."""
    from torch.profiler import ProfilerActivity, profile

    keys = sorted(k for k in runner.graphs if k and k[0] == batch and k[-1] == 1)
    if not keys or SMOKE:
        return []
    step = runner.graphs.steps[keys[-1]]
    step.replay()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.replay()
        sync()
    rows = sorted(
        ((e.key, e.self_device_time_total / 3 / 1e3, e.count // 3) for e in prof.key_averages()),
        key=lambda r: -r[1],
    )
    total = sum(r[1] for r in rows)
    log(f"profile batch {batch} {keys[-1]}: {total:.3f} ms of kernels per step")
    top = [{"kernel": name[:100], "ms": round(ms, 4), "calls": n} for name, ms, n in rows[:25]]
    for r in top:
        log("   ", r)
    return top


def op_sites(runner, batch: int) -> dict[str, int]:
    """The torch operators of the plain decode graph of ``batch`` rows (largest context bucket), each with the
    line that issued it: the captured step run once more, eagerly, on its captured batch (it rewrites the same
    KV entries with the same values). The profile names kernels, not their callers; this names the callers
    (a ``direct_copy_kernel_cuda`` is a ``copy_``, ``_to_copy``, ``clone`` or ``contiguous`` here)."""
    from op_sites import OpSites

    keys = sorted(k for k in runner.graphs if k and k[0] == batch and k[-1] == 1)
    if not keys or SMOKE:
        return {}
    counter = OpSites()
    with torch.inference_mode(), counter:
        runner._forward(runner.graphs.steps[keys[-1]].keepalive)
    sync()
    log(f"torch operators of one eager run of step {keys[-1]}: {sum(counter.ops.values())}")
    for pair, n in counter.pairs.most_common(60):
        log(f"    {n:4d}  {pair}")
    return dict(counter.pairs.most_common())


def profile_call(fn) -> dict:
    """GPU time per kernel name of one call of ``fn`` (a prefill: which ops hold it back from the matmul rate), and
    where the GPU waited: the call's span, the union of its kernels' intervals (busy), the largest gaps between
    kernels with the host operator running just before each, and the host's launches and synchronisations."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        sync()
    rows = sorted(
        ((e.key, e.self_device_time_total / 1e3, e.count) for e in prof.key_averages()), key=lambda r: -r[1]
    )
    rows = [r for r in rows if r[1] > 0]
    log(f"profile: {sum(r[1] for r in rows):.3f} ms of kernels")
    top = [{"kernel": name[:100], "ms": round(ms, 3), "calls": n} for name, ms, n in rows[:30]]
    for r in top:
        log("   ", r)
    events = prof.events()
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    host = sorted(
        (e.time_range.start, e.name)
        for e in events
        if e.device_type == DeviceType.CPU and not e.name.startswith("cuda")
    )
    busy, gaps, end = 0.0, [], None
    for a, b in kernels:
        if end is None or a > end:
            if end is not None:
                gaps.append((a - end, end))
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    names = [h[1] for h in host]
    starts = [h[0] for h in host]

    def before(t):  # the last host operator that started before the GPU went idle at t
        import bisect

        i = bisect.bisect_right(starts, t) - 1
        return names[i] if i >= 0 else ""

    api = defaultdict(int)
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith("cuda"):
            api[e.name] += 1
    idle = {
        "span_ms": round(span / 1e3, 3),
        "busy_ms": round(busy / 1e3, 3),
        "idle_ms": round((span - busy) / 1e3, 3),
        "gaps": len(gaps),
        "largest_gaps": [
            {"ms": round(g / 1e3, 3), "after_host_op": before(t)[:80]}
            for g, t in sorted(gaps, reverse=True)[:12]
        ],
        "cuda_api_calls": dict(sorted(api.items(), key=lambda kv: -kv[1])[:12]),
    }
    log("profile: GPU idle", {k: v for k, v in idle.items() if k != "largest_gaps"})
    for g in idle["largest_gaps"]:
        log("    gap", g)
    return {"kernels": top, "idle": idle}


def host_profile_text(prof) -> dict[str, str]:
    """The 40 costliest functions of a profiled ``generate`` (Python's cProfile: host time; the step times of
    a profiled run are not figures), by own time and by cumulative time."""
    out = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(40)
        out[key] = buf.getvalue()[-12000:]
    return out
