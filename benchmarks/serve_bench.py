"""``deepinfer serve`` under load: a concurrency sweep against a running server, with the offline engine
on the same prompts as the reference.

The server runs in its own process (``deepinfer serve`` on a free port, the same engine flags); this
process is the client, and runs the offline reference (``LLM.generate``) while the server is idle, so the
two are never measured at once. Each of ``--repeat`` rounds runs, in turn:

- offline, all prompts of the largest level at once (the engine batches up to ``--max-num-seqs``), and the
  smallest level's prompts one at a time;
- the server, for each concurrency ``c``: ``max(--min-prompts, 2c)`` streaming completions, at most ``c``
  in flight (a new one starts when one finishes). The client times every request: time to first token
  (TTFT), time per output token after the first (TPOT); a level's throughput is its output tokens over its
  wall time.

Rounds alternate offline and server runs, and each figure is the median over rounds, because the machine
may be shared and its load may change. Both sides first run the largest level once untimed (the first
touches of the KV pools' memory are slow). Beside wall-clock throughput, the CPU time of the server process
(all its threads: HTTP, event loop, step loop, torch) per output token is compared with the offline
process's: on a quiet machine they agree, on a shared one CPU time is the steadier of the two. Steadier
still is the share of the server's CPU time spent by its main thread, which runs the event loop (HTTP,
request parsing, server-sent events, text decoding): an upper bound on what serving adds to the engine's
own work even if none of it overlapped the step (Linux only).

Prompts are random token ids of ``--input-len``; every request generates exactly ``--output-len`` tokens
(``ignore_eos``), greedy. The server's overhead at concurrency ``c`` is ``1 - server / offline`` against the
offline run at the same concurrency: all at once for ``c >= --max-num-seqs``, one at a time for ``c = 1``.

``--model toy`` serves the engine tests' toy model instead (microseconds per token, so what is measured is
almost only the server and the engine's bookkeeping: a stress test of the server's own cost).

Usage: ``python benchmarks/serve_bench.py [--concurrency 1 8 32 64] [--repeat 3] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from deepinfer_core import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint (default: the demo checkpoint), or 'toy'")
    p.add_argument("--backend", default="auto", help="platform of both the server and the offline engine")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--min-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--serve-toy", action="store_true", help=argparse.SUPPRESS)  # the toy model's server
    return p.parse_args(argv)


def engine_flags(ns: argparse.Namespace) -> dict:
    flags = {"max_num_seqs": ns.max_num_seqs, "max_model_len": ns.max_model_len, "backend": ns.backend}
    return {**flags, "model": ns.model} if ns.model and ns.model != "toy" else flags


def make_llm(ns: argparse.Namespace) -> LLM:
    if ns.model != "toy":
        return LLM(**engine_flags(ns))
    sys.path.insert(0, str(ROOT))
    import torch

    from tests.engine.conftest import make_toy_llm

    torch.set_num_threads(1)  # as the reference platform runs torch (the toy engine skips the platform)

    return make_toy_llm(
        kv_cache_memory_bytes=64 << 20, **{k: v for k, v in engine_flags(ns).items() if k != "backend"}
    )


def serve_toy(ns: argparse.Namespace) -> int:
    """The server process of ``--model toy``: announces its URL as ``deepinfer serve`` does."""
    from deepinfer_core.engine.async_llm import AsyncLLM
    from deepinfer_core.serve.server import make_server
    from deepinfer_core.serve.settings import ServeSettings

    llm = AsyncLLM(make_llm(ns).engine)
    url = lambda s: print(f"at http://127.0.0.1:{s.port}/v1", file=sys.stderr, flush=True)  # noqa: E731
    make_server(llm, ServeSettings(port=0, log_level="warning"), "toy", on_started=url).run()
    return 0


def cpu_seconds(pid: int | None = None, tid: int | None = None) -> float:
    """CPU time (user + system) so far of a process (all threads): this one, or ``pid``; or of its thread
    ``tid`` only (Linux ``/proc``)."""
    if pid is None:
        return time.process_time()
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def offline(llm: LLM, prompts: list[list[int]], ns: argparse.Namespace, one_at_a_time: bool = False) -> dict:
    """Output tokens per wall second and CPU seconds per 1k output tokens of ``LLM.generate``."""
    sp = SamplingParams(temperature=0, max_tokens=ns.output_len, ignore_eos=True)
    batches = [[p] for p in prompts] if one_at_a_time else [prompts]
    t0, c0, n = time.perf_counter(), cpu_seconds(), 0
    for batch in batches:
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], sp, use_tqdm=False)
        n += sum(len(o.outputs[0].token_ids) for o in outs)
    return {"tok_s": n / (time.perf_counter() - t0), "cpu_s_per_1k_tok": 1000 * (cpu_seconds() - c0) / n}


def start_server(ns: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    if ns.model == "toy":
        cmd = [
            sys.executable,
            __file__,
            "--serve-toy",
            "--model",
            "toy",
            "--max-num-seqs",
            str(ns.max_num_seqs),
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "deepinfer_core.cli.main",
            "serve",
            "--port",
            "0",
            "--log-level",
            "warning",
        ]
        cmd += ["--max-waiting-requests", "100000"]
        for k, v in engine_flags(ns).items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(x) for x in proc.stderr] + [lines.put(None)], daemon=True
    ).start()
    while True:
        line = lines.get(timeout=300)
        if line is None:
            raise SystemExit("the server exited before serving")
        m = re.search(r"at (http://\S+/v1)", line)
        if m:
            return proc, m.group(1)


async def one_request(client: httpx.AsyncClient, prompt: list[int], ns: argparse.Namespace) -> dict:
    body = {"prompt": prompt, "max_tokens": ns.output_len, "temperature": 0, "ignore_eos": True}
    body.update(stream=True, return_token_ids=True)
    t0, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", "/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                n = sum(len(c.get("token_ids") or ()) for c in json.loads(line[6:])["choices"])
                first = time.perf_counter() if n and first is None else first
                tokens += n
    end = time.perf_counter()
    return {"ttft": first - t0, "tpot": (end - first) / max(1, tokens - 1), "tokens": tokens}


async def level(url: str, pid: int, prompts: list[list[int]], c: int, ns: argparse.Namespace) -> dict:
    slots = asyncio.Semaphore(c)
    limits = httpx.Limits(max_connections=c + 8, max_keepalive_connections=c + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def bounded(p: list[int]) -> dict:
            async with slots:
                return await one_request(client, p, ns)

        t0, c0, h0 = time.perf_counter(), cpu_seconds(pid), cpu_seconds(pid, pid)
        results = await asyncio.gather(*[bounded(p) for p in prompts])
        wall, cpu, http = time.perf_counter() - t0, cpu_seconds(pid) - c0, cpu_seconds(pid, pid) - h0
    ttft = sorted(r["ttft"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {
        "tok_s": tokens / wall,
        "cpu_s_per_1k_tok": 1000 * cpu / tokens,
        "http_cpu_share": http / cpu,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": ttft[len(ttft) // 2],
        "ttft_p99_s": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
        "tpot_mean_s": statistics.fmean(r["tpot"] for r in results),
    }


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> int:
    ns = parse_args()
    if ns.serve_toy:
        return serve_toy(ns)
    levels = sorted(ns.concurrency)
    counts = {c: max(ns.min_prompts, 2 * c) for c in levels}
    llm = make_llm(ns)
    rng = random.Random(ns.seed)
    prompts = [
        [rng.randrange(2, llm.vocab_size) for _ in range(ns.input_len)] for _ in range(max(counts.values()))
    ]
    big, small = prompts[: counts[levels[-1]]], prompts[: counts[levels[0]]]
    offline(llm, big, ns)  # warm-up
    proc, url = start_server(ns)
    runs: dict = {"offline_batched": [], "offline_sequential": [], **{c: [] for c in levels}}
    try:
        asyncio.run(level(url, proc.pid, big, levels[-1], ns))  # warm-up
        for i in range(ns.repeat):
            runs["offline_batched"].append(offline(llm, big, ns))
            runs["offline_sequential"].append(offline(llm, small, ns, one_at_a_time=True))
            for c in levels:
                runs[c].append(asyncio.run(level(url, proc.pid, prompts[: counts[c]], c, ns)))
            done = {k: round(v[-1]["tok_s"], 1) for k, v in runs.items()}
            print(f"round {i + 1}/{ns.repeat}: output tok/s {done}", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    report(ns, counts, {k: median_of(v) for k, v in runs.items()}, runs)
    return 0


def report(ns: argparse.Namespace, counts: dict, med: dict, runs: dict) -> None:
    header = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "command": " ".join(["python", *sys.argv]),
        "offline_batched": med["offline_batched"],
        "offline_sequential": med["offline_sequential"],
    }
    print(json.dumps(header))
    print(
        "| concurrency | requests | output tok/s | offline tok/s | overhead (wall) | CPU s / 1k tok, server | "
        "offline | overhead (CPU) | HTTP thread CPU share | TTFT mean / p50 / p99 s | TPOT mean ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in sorted(counts):
        r = med[c]
        base = (
            med["offline_sequential"] if c == 1 else med["offline_batched"] if c >= ns.max_num_seqs else None
        )
        cols = ["-", "-", "-", "-"]
        if base is not None:
            wall, cpu = 1 - r["tok_s"] / base["tok_s"], r["cpu_s_per_1k_tok"] / base["cpu_s_per_1k_tok"] - 1
            cols = [
                f"{base['tok_s']:.1f}",
                f"{100 * wall:.1f}%",
                f"{base['cpu_s_per_1k_tok']:.2f}",
                f"{100 * cpu:.1f}%",
            ]
        print(
            f"| {c} | {counts[c]} | {r['tok_s']:.1f} | {cols[0]} | {cols[1]} | {r['cpu_s_per_1k_tok']:.2f} | "
            f"{cols[2]} | {cols[3]} | {100 * r['http_cpu_share']:.1f}% | {r['ttft_mean_s']:.3f} / {r['ttft_p50_s']:.3f} / {r['ttft_p99_s']:.3f} | "
            f"{1000 * r['tpot_mean_s']:.1f} |"
        )
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    "header": header,
                    "median": {str(k): v for k, v in med.items()},
                    "runs": {str(k): v for k, v in runs.items()},
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    sys.exit(main())
