"""Host time per engine decode step, outside the forward pass, on the real tiny DeepSeek-V4 model.

The engine runs a built-in demo checkpoint (``--model``; default ``demo-v4``, ``deepinfer_core/demo_model``: 4
layers, CSA and HCA, vocabulary 8192; ``demo-v41`` is the V4.1 demo) on the reference backend, so every step goes through the whole host path a user's step
takes: scheduling, building the batch, ``model.plan`` (slot tables) and the copy of both to the device,
sampling, output processing. Each decode step is timed as CPU time of the engine thread
(``time.thread_time``, torch on one thread: robust to other load on the machine), and split by wrapping
the engine's parts (so the same script measures any revision of the engine):

- ``schedule``: ``Scheduler.schedule``;
- ``prepare``: ``ModelRunner.prepare``: inputs, block tables, ``model.plan``, the copy to the device;
- ``rest``: everything else on the host: the sampler's own work (parameter and key tensors), output
  processing (token append, stop checks), ``Scheduler.update``, request bookkeeping;
- ``host``: the sum, i.e. the step minus the forward pass (``ModelRunner.run``) and the sampling ops
  (``backends.sampling``), which are device work on a real platform (``forward``, ``sampling_ops``).

By default the forward pass itself is replaced by random logits of the model's vocabulary (``--real-forward``
runs it: on the CPU it costs about 18 ms per sequence per step, and it does not change the host path,
whose every part, ``model.plan`` and the copies included, still runs for real).

With ``--async`` the engine overlaps (``async_scheduling=True``); on the CPU nothing runs at the same time,
so the host time is what would be hidden behind a device step.

With ``--static`` the decode steps have static shapes (padded to a batch bucket, as replayed graphs are; not
captured here), and with ``--device-plan`` too their slot plan is built inside the step (``forward``).

Usage: ``python benchmarks/engine_overhead.py [--seqs 1 16 64 256 1024] [--steps 20] [--greedy] [--async]
[--real-forward] [--prompt-len 64] [--static [--device-plan]]``
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.llm import LLM
from deepinfer_core.sampling_params import SamplingParams


class Clock:
    """CPU time spent inside wrapped callables, by name (nested calls counted once, in the outer one)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._depth = 0
        self.current: str | None = None

    def wrap(self, name: str, fn):
        def timed(*a, **k):
            if self._depth:
                return fn(*a, **k)
            self._depth += 1
            self.current = name
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[name] += time.thread_time() - t
                self._depth -= 1
                self.current = None

        return timed


class OpCounter(TorchDispatchMode):
    """Counts the torch operators the host issues (each one at least a launch on a GPU, ~5-10 us of host time
    there), by the engine part running (``Clock`` names; ``rest`` outside them) and by operator."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock = clock
        self.by_part: dict[str, int] = defaultdict(int)
        self.by_op: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        part = self.clock.current or "rest"
        self.by_part[part] += 1
        self.by_op[f"{part}:{func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


class TimedOps:
    """Proxy adding the time of every sampling op to ``clock.seconds["sampling_ops"]``."""

    def __init__(self, ops, clock: Clock):
        self.ops, self.clock = ops, clock

    def __getattr__(self, name):
        return self.clock.wrap("sampling_ops", getattr(self.ops, name))


def stub_forward(model) -> None:
    """Replace the forward pass (device work) with random logits; ``model.plan`` stays real."""
    gen = torch.Generator().manual_seed(0)
    model.forward = lambda batch, kv: torch.zeros(batch.num_tokens, 1)
    model.compute_logits = lambda h: torch.randn(h.shape[0], model.vocab_size, generator=gen)


PROMPT_LEN = 64
#: ``--static`` / ``--device-plan``
STATIC = DEVICE_PLAN = False


def build(
    num_seqs: int, greedy: bool, async_: bool, real: bool, seed: int = 0, model: str = "demo-v4"
) -> tuple[LLM, Clock]:
    llm = LLM(
        model=model,
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max(2048, num_seqs),
        max_model_len=PROMPT_LEN + 960,
        kv_cache_memory_bytes=max(1 << 30, num_seqs * (PROMPT_LEN + 64) * 4096),
        enforce_eager=True,
        **({"async_scheduling": True} if async_ else {}),  # (so the script also runs on older revisions)
    )
    e = llm.engine
    if STATIC:  # static steps (as graphs are replayed), uncaptured; the plan on the device with --device-plan
        e.runner.static_decode(num_seqs, capture=False)
        e.runner.device_plan = DEVICE_PLAN and e.model.device_plan
    if not real:
        stub_forward(e.model)
    rng = random.Random(seed)
    for i in range(num_seqs):
        sp = SamplingParams(
            max_tokens=950, ignore_eos=True, temperature=0.0 if greedy else 0.8, top_p=0.95, seed=i
        )
        e.add_request(ProcessedPrompt(None, [rng.randrange(2, 8000) for _ in range(PROMPT_LEN)], sp))
    while any(s.is_prefill for s in e.scheduler.running) or e.scheduler.waiting:
        e.step()
    for _ in range(2):  # settle into decode (and, with overlap, a step in flight)
        e.step()
    clock = Clock()
    e.scheduler.schedule = clock.wrap("schedule", e.scheduler.schedule)
    e.runner.prepare = clock.wrap("prepare", e.runner.prepare)
    e.runner.run = clock.wrap("forward", e.runner.run)
    e.sampler.ops = TimedOps(e.sampler.ops, clock)
    return llm, clock


def count_ops(num_seqs: int, steps: int, greedy: bool, async_: bool, model: str = "demo-v4") -> OpCounter:
    """The torch operators of ``steps`` decode steps (forward pass stubbed), per step."""
    llm, clock = build(num_seqs, greedy, async_, False, model=model)
    counter = OpCounter(clock)
    with counter:
        for _ in range(steps):
            llm.engine.step()
    return counter


def measure(
    num_seqs: int, steps: int, greedy: bool, async_: bool, real: bool, repeats: int, model: str = "demo-v4"
) -> dict[str, float]:
    """Per-step means (ms) over ``steps`` decode steps; the best of ``repeats`` fresh engines."""
    best: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        llm, clock = build(num_seqs, greedy, async_, real, model=model)
        e = llm.engine
        total = 0.0
        for _ in range(steps):
            t = time.thread_time()
            e.step()
            total += time.thread_time() - t
        assert len(e.scheduler.running) == num_seqs
        s = clock.seconds
        host = total - s["forward"] - s["sampling_ops"]
        row = {
            "schedule": s["schedule"],
            "prepare": s["prepare"],
            "rest": host - s["schedule"] - s["prepare"],
            "host": host,
            "forward": s["forward"],
            "sampling_ops": s["sampling_ops"],
        }
        for k, v in row.items():
            best[k].append(v / steps * 1e3)
    return {k: min(v) for k, v in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--async", dest="async_", action="store_true", help="async_scheduling=True")
    ap.add_argument("--real-forward", action="store_true", help="run the model's forward pass too")
    ap.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help="prompt tokens (the context)")
    ap.add_argument(
        "--model", default="demo-v4", help="a shipped demo (demo-v4, demo-v41) or a checkpoint path"
    )
    ap.add_argument(
        "--count-ops",
        action="store_true",
        help="count the torch operators per step by part, instead of timing",
    )
    ap.add_argument(
        "--static",
        action="store_true",
        help="static decode steps (padded to a batch bucket, as replayed graphs are), not captured",
    )
    ap.add_argument(
        "--device-plan",
        action="store_true",
        help="with --static: the slot plan built inside the step (counted as forward: device work)",
    )
    args = ap.parse_args()
    globals()["PROMPT_LEN"] = args.prompt_len
    globals()["STATIC"], globals()["DEVICE_PLAN"] = args.static, args.device_plan
    if args.count_ops:
        for n in args.seqs:
            c = count_ops(n, args.steps, args.greedy, args.async_, args.model)
            parts = {k: v / args.steps for k, v in sorted(c.by_part.items())}
            print(f"seqs {n}: torch operators a decode step {sum(parts.values()):.1f}: {parts}")
            for op, v in sorted(c.by_op.items(), key=lambda kv: -kv[1])[:25]:
                print(f"    {op}: {v / args.steps:.1f}")
        return
    torch.set_num_threads(1)
    print(
        f"{args.model} (reference backend); sampling: {'greedy' if args.greedy else 'top-p 0.95, seeded'}; "
        f"async_scheduling={args.async_}; forward: {'real' if args.real_forward else 'random logits'}; "
        f"{args.prompt_len}-token prompts; {args.steps} decode steps, best of {args.repeats}; "
        f"static={args.static}, device_plan={args.device_plan}"
    )
    cols = ["schedule", "prepare", "rest", "host", "forward", "sampling_ops"]
    print(f"{'seqs':>6} " + " ".join(f"{c:>12}" for c in cols) + "  (ms/step, CPU time)")
    for n in args.seqs:
        r = measure(n, args.steps, args.greedy, args.async_, args.real_forward, args.repeats, args.model)
        print(f"{n:>6} " + " ".join(f"{r[c]:>12.3f}" for c in cols), flush=True)


if __name__ == "__main__":
    main()
