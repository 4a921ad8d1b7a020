"""V4.1 on the NVIDIA plugin, eager, against DeepSeek's reference (issue #27's first check; issue #24's Engram tier
inside a real V4.1 forward on a GPU).

On each committed tiny V4.1 checkpoint (``tests/data/v41``), an ``LLM`` on ``cuda_sm100`` (``dtype="float32",
kv_cache_dtype="unquantized", enforce_eager=True``) computes prompt logprobs and 16 greedy tokens for every golden
prompt; both are compared with the reference's ``exact`` goldens by the rule of
``tests/models/deepseek_v41/test_engine_vs_reference.py`` (positions within 1e-3, median, greedy tokens equal
until a near-tie). V4.1's own ops (single-pass mHC, Engram gate, indexer scores, candidate blocks) run as the
core's torch defaults on the GPU: this checks correctness, not speed. Also counted: Engram row reads, the
thread they ran on and whether they went through the side-stream copy.

``--kv auto``: V4.1's trained FP8 / FP4 cache instead (the plugin's ``packed_kv`` path), on the prompts of up to
96 tokens, against the reference's ``kvq_only`` goldens by that test's bounds (``QUANTIZED_BOUNDS``).

    python3 benchmarks/gpu/v41_greedy.py [--out DIR] [--max-num-seqs 1]

``--max-num-seqs 1`` decodes one prompt at a time: decode steps of one token, where ``cuda_sm100`` runs each mHC
boundary in its two fused launches (up to ``dispatch.HC_FUSED_MAX_TOKENS`` tokens); with all the prompts at once
(the default) no decode step is that small.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import traceback
from pathlib import Path

from bench_common import make_llm

from deepinfer_core import SamplingParams
from deepinfer_core.models.deepseek_v41 import engram_tier
from tests.models.deepseek_v41.goldens import CONFIGS, checkpoint, prompts
from tests.models.deepseek_v41.test_engine_vs_reference import (
    GREEDY,
    QUANTIZED_BOUNDS,
    QUANTIZED_MAX_LEN,
    compare,
)

READS: list[tuple[str, str]] = []
_read = engram_tier.EngramTable._read


def _counting_read(self, ids, ready):
    READS.append((threading.current_thread().name, self.device.type))
    return _read(self, ids, ready)


engram_tier.EngramTable._read = _counting_read


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--backend", default="cuda_sm100")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--modes", nargs="+", default=["eager"], choices=["eager", "graphs"])
    ap.add_argument("--dspark", type=int, default=0, help="DSpark drafts a round (0: off)")
    ap.add_argument("--kv", default="unquantized", choices=["unquantized", "auto"])
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="sequences decoded at once (1: every decode step one token, the fused 1-2 token mHC boundary's path; "
        "by default all the prompts at once, which never takes it)",
    )
    args = ap.parse_args()
    results = {}
    for mode, name in [(m, n) for m in args.modes for n in args.configs]:
        try:
            results[f"{mode}/{name}"] = run(args.backend, name, mode, args.dspark, args.kv, args.max_num_seqs)
        except Exception as e:  # noqa: BLE001 - a config that fails is reported, the others still run
            traceback.print_exc()
            results[f"{mode}/{name}"] = {"error": f"{type(e).__name__}: {e}"}
        print(mode, name, results[f"{mode}/{name}"], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "v41_greedy.json").write_text(json.dumps(results, indent=1))


def run(
    backend: str,
    name: str,
    mode: str,
    dspark: int = 0,
    kv: str = "unquantized",
    max_num_seqs: int | None = None,
) -> dict:
    g, idx = prompts(name)
    if kv == "auto":
        idx = [i for i in idx if len(g[f"prompt.{i}.ids"]) <= QUANTIZED_MAX_LEN]
    t0 = time.perf_counter()
    llm = make_llm(
        str(checkpoint(name)),
        backend,
        dtype="float32",
        kv_cache_dtype=kv,
        skip_tokenizer_init=True,  # token-id prompts: no transformers needed on the device
        enforce_eager=mode == "eager",
        speculative_config={"method": "dspark", "num_speculative_tokens": dspark} if dspark else None,
        **({"max_num_seqs": max_num_seqs} if max_num_seqs else {}),
    )
    llm.engine.isolate_failures = False  # a failing step raises with its traceback instead of being retried
    READS.clear()
    params = SamplingParams(max_tokens=GREEDY, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": g[f"prompt.{i}.ids"].tolist()} for i in idx], params, use_tqdm=False
    )
    golden = "exact" if kv == "unquantized" else "kvq_only"
    a = compare(g, idx, outs, golden)
    threads = sorted({t for t, _ in READS})
    r = {
        "prompts": len(idx),
        "within_1e3": a.within_1e3,
        "median": a.median,
        "max": float(a.diffs.max()),
        "greedy": f"{a.greedy_equal}/{a.greedy_compared}",
        "stopped": a.stopped,
        "engram_reads": len(READS),
        "engram_threads": threads,
        "engram_devices": sorted({d for _, d in READS}),
        "graphs_captured": len(llm.engine.runner.graphs),
        "graph_keys": sorted(str(k) for k in llm.engine.runner.graphs),
        "spec": {k: v for k, v in llm.get_stats().items() if k.startswith("spec_")} if dspark else None,
        "seconds": round(time.perf_counter() - t0, 1),
        "passes": a.within_1e3 >= 0.97 and a.median <= 1e-4 and a.greedy_equal >= a.greedy_compared,
    }
    if kv == "auto":  # the quantized cache against kvq_only, by the CPU test's bounds
        bound, share = QUANTIZED_BOUNDS["kvq_only"], a.greedy_equal / max(1, a.greedy_compared)
        r["mean_abs"] = float(a.diffs.mean())
        r["passes"] = r["mean_abs"] <= bound["mean_abs"] and share >= bound["greedy_share"]
    return r


if __name__ == "__main__":
    main()
