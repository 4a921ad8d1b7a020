"""Find host synchronisations in V4.1's static steps on a GPU (what stops graph capture).

Runs the golden prompts of a tiny V4.1 checkpoint on ``cuda_sm100`` with static (uncaptured) decode steps and
``torch.cuda.set_sync_debug_mode("error")`` around each static forward (not around ``prepare_static``, whose
host-tier read waits by design), so the first synchronising op raises with its traceback.

    python3 benchmarks/gpu/v41_sync_probe.py [--configs flash_mini ...]
"""

from __future__ import annotations

import argparse
import traceback

import torch
from bench_common import make_llm

from deepinfer_core import SamplingParams
from tests.models.deepseek_v41.goldens import CONFIGS, checkpoint, prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    args = ap.parse_args()
    for name in args.configs:
        g, idx = prompts(name)
        llm = make_llm(str(checkpoint(name)), "cuda_sm100", dtype="float32", kv_cache_dtype="unquantized",
                       enforce_eager=True)  # fmt: skip
        llm.engine.isolate_failures = False
        runner = llm.engine.runner
        runner.static_decode(8, capture=False)
        forward = runner._forward

        def checked(batch, *inputs, forward=forward):
            if batch.graph_key is None:
                return forward(batch, *inputs)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                return forward(batch, *inputs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        runner._forward = checked
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        try:
            llm.generate(
                [{"prompt_token_ids": g[f"prompt.{i}.ids"].tolist()} for i in idx], params, use_tqdm=False
            )
            print(name, "no host synchronisation in static steps", flush=True)
        except Exception:  # noqa: BLE001 - report and go on
            print(name, "SYNC:", flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()
