"""What batch invariance costs on the reference platform, and what it buys.

Runs a tiny random-weight DeepSeek-V4 checkpoint (the test suite's CSA + HCA model) through the engine
twice: with the reference dense/MoE ops as shipped (row by row, batch invariant), and with their
row loops replaced by one batched call per op (``per_row(fn, *xs) -> fn(*xs)``, ``linear`` as one
``F.linear``). Attention and mHC's ``hc_pre`` stay per row in both. Reports the process CPU time (torch
on one thread, best of two runs) of a 20-prompt batch and whether each prompt's greedy tokens and
logprobs equal its results when run alone.

Usage: ``python benchmarks/engine_determinism_cost.py``
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf  # noqa: E402

import deepinfer_core.ops.reference.dense as dense  # noqa: E402
import deepinfer_core.ops.reference.moe as moe  # noqa: E402
from deepinfer_core import LLM, SamplingParams  # noqa: E402


def batched_mode(on: bool) -> None:
    orig = batched_mode.__dict__.setdefault("orig", (dense.per_row, dense.linear_rows, moe.per_row))
    if on:
        dense.per_row = moe.per_row = lambda fn, *xs: fn(*xs)
        dense.linear_rows = lambda x, w: F.linear(x, w)
    else:
        dense.per_row, dense.linear_rows, moe.per_row = orig


def workload() -> tuple[list[dict], SamplingParams]:
    rng = random.Random(7)
    lens = [1, 2, 16, 17, 40, 400, 64, 5] + [rng.randint(1, 160) for _ in range(12)]
    prompts = [{"prompt_token_ids": [rng.randrange(2, 320) for _ in range(n)]} for n in lens]
    return prompts, SamplingParams(max_tokens=16, temperature=0.0, logprobs=1, ignore_eos=True)


def run(path: str, batched: bool) -> tuple[float, int, float]:
    batched_mode(batched)
    try:
        prompts, sp = workload()
        llm = LLM(path, kv_cache_memory_bytes=64 << 20, max_model_len=512, enable_prefix_caching=False)
        t0 = time.process_time()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        elapsed = time.process_time() - t0
        alone = [llm.generate([p], sp, use_tqdm=False)[0] for p in prompts]
    finally:
        batched_mode(False)
    diff_tokens, max_lp = 0, 0.0
    for a, b in zip(outs, alone):
        ca, cb = a.outputs[0], b.outputs[0]
        diff_tokens += ca.token_ids != cb.token_ids
        if ca.token_ids == cb.token_ids:
            for x, y in zip(ca.logprobs, cb.logprobs):
                max_lp = max(max_lp, max(abs(x[t].logprob - y[t].logprob) for t in x))
    return elapsed, diff_tokens, max_lp


def main() -> None:
    path = tempfile.mkdtemp()
    build_hf(Schedule("engine", (CSA, HCA)), seed=0).save_pretrained(path)
    n_tok = sum(len(p["prompt_token_ids"]) + 16 for p in workload()[0])
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); 20 prompts, {n_tok} tokens, one batch"
    )
    for batched in (False, True):
        (t, diff, lp), (t2, _, _) = run(path, batched), run(path, batched)
        t = min(t, t2)
        name = "batched ops (not invariant)" if batched else "row-wise ops (invariant)"
        print(
            f"{name:>28}: {t:6.2f} s ({n_tok / t:6.0f} tok/s); prompts differing from alone: {diff}/20; "
            f"max |logprob diff| where tokens agree: {lp:.2e}"
        )


if __name__ == "__main__":
    main()
