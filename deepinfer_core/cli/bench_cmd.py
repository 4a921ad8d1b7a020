"""``deepinfer bench``: throughput and latency of a synthetic generation workload."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from deepinfer_core.cli.generate_cmd import make_llm


def run(ns: argparse.Namespace) -> int:
    from deepinfer_core import SamplingParams

    llm = make_llm(ns)
    rng = random.Random(ns.bench_seed)
    vocab = llm.vocab_size
    prompts = [
        {"prompt_token_ids": [rng.randrange(vocab) for _ in range(ns.input_len)]}
        for _ in range(ns.num_prompts)
    ]
    params = SamplingParams(
        max_tokens=ns.output_len, ignore_eos=True, temperature=ns.temperature, seed=ns.bench_seed
    )
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=not ns.json)
    elapsed = time.perf_counter() - t0
    n_in = sum(len(o.prompt_token_ids) for o in outs)
    n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
    ttft = [
        o.metrics.first_token_time for o in outs if getattr(o.metrics, "first_token_time", None) is not None
    ]
    tpot = [
        o.metrics.time_per_output_token for o in outs if getattr(o.metrics, "time_per_output_token", None)
    ]
    res = {
        "backend": llm.backend_name,
        "num_prompts": ns.num_prompts,
        "input_len": ns.input_len,
        "output_len": ns.output_len,
        "elapsed_s": elapsed,
        "requests_per_s": len(outs) / elapsed,
        "input_tokens_per_s": n_in / elapsed,
        "output_tokens_per_s": n_out / elapsed,
        "mean_ttft_s": statistics.fmean(ttft) if ttft else None,
        "mean_tpot_s": statistics.fmean(tpot) if tpot else None,
    }
    if ns.json:
        print(json.dumps(res, indent=2))
    else:
        for k, v in res.items():
            print(f"{k:>20}: {v:.4g}" if isinstance(v, float) else f"{k:>20}: {v}")
    return 0
