"""How far SWA bounded replay (``swa_bounded_replay=True``) moves V4.1 from the exact path.

On each committed tiny V4.1 checkpoint (``tests/data/v41``), float32, unquantized KV: every golden prompt longer
than the sliding window is prefilled in chunks of ``--chunk`` tokens with bounded replay on, then decoded greedily
for ``--tokens`` tokens. Each generated token's logprob is compared with the exact path's teacher-forced logprob of
the same token (every layer on every row: prompt logprobs over prompt + generated tokens), and the greedy tokens
with the exact path's. Prints a Markdown table (docs/models.md, "SWA bounded replay").

    python benchmarks/v41_bounded_replay.py [--chunk 64] [--tokens 16]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from deepinfer_core import LLM, SamplingParams
from tests.models.deepseek_v41.goldens import CONFIGS, checkpoint, inference_config, prompts


def measure(name: str, chunk: int, tokens: int) -> dict:
    window = inference_config(name)["window_size"]
    g, idx = prompts(name)
    ids = [g[f"prompt.{i}.ids"].tolist() for i in idx]
    ids = [x for x in ids if len(x) > window]
    common = dict(model=str(checkpoint(name)), dtype="float32", kv_cache_dtype="unquantized")
    greedy = SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=0, ignore_eos=True)
    replay = LLM(**common, swa_bounded_replay=True, max_num_batched_tokens=chunk, enable_prefix_caching=False)
    exact = LLM(**common, max_num_batched_tokens=max(chunk, 1024), enable_prefix_caching=False)
    got = replay.generate([{"prompt_token_ids": x} for x in ids], greedy, use_tqdm=False)
    ref = exact.generate([{"prompt_token_ids": x} for x in ids], greedy, use_tqdm=False)
    forced = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    diffs, first, same = [], [], 0
    for x, a, b in zip(ids, got, ref, strict=True):
        toks = a.outputs[0].token_ids
        tf = exact.generate([{"prompt_token_ids": x + toks}], forced, use_tqdm=False)[0].prompt_logprobs
        lp = [a.outputs[0].logprobs[j][t].logprob for j, t in enumerate(toks)]
        d = [abs(lp[j] - tf[len(x) + j][t].logprob) for j, t in enumerate(toks)]
        diffs += d
        first.append(d[0])
        n = next((j for j, (u, v) in enumerate(zip(toks, b.outputs[0].token_ids)) if u != v), len(toks))
        same += n
    return {
        "config": name,
        "window": window,
        "prompts": len(ids),
        "lengths": f"{min(map(len, ids))}-{max(map(len, ids))}",
        "mean": statistics.fmean(diffs),
        "median": statistics.median(diffs),
        "max": max(diffs),
        "first_mean": statistics.fmean(first),
        "greedy_same": same,
        "greedy_total": tokens * len(ids),
        "rows": None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"chunk {args.chunk}, {args.tokens} greedy tokens per prompt")
    print(
        "| config | window | prompts (tokens) | mean / median / max \\|Δ logprob\\| | first token mean | greedy equal |"
    )
    print("|---|---|---|---|---|---|")
    for name in CONFIGS:
        r = measure(name, args.chunk, args.tokens)
        print(
            f"| {name} | {r['window']} | {r['prompts']} ({r['lengths']}) | {r['mean']:.2e} / {r['median']:.2e} / "
            f"{r['max']:.2e} | {r['first_mean']:.2e} | {r['greedy_same']} / {r['greedy_total']} |"
        )


if __name__ == "__main__":
    main()
