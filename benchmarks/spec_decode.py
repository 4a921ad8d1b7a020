"""Speculative decoding: acceptance length per k and target steps per output token.

Each prompt runs alone (batch 1, greedy, one prefill chunk), so a plain run takes one target step per
output token after the prefill step. With speculation a step verifies ``1 + drafts`` rows and emits
``1 + accepted`` tokens; the figure of merit is *target steps per output token* (engine ``step()``
calls / generated tokens) and its ratio to the plain run (the step speedup; wall time on CPU is printed
too, but there every extra row costs nearly as much as a step, so it is not the GPU picture).

Methods: ``ngram`` on repetitive text (code with repeated lines, a repeated list, prose with a refrain);
``mtp`` when the checkpoint has MTP modules (``num_nextn_predict_layers > 0``, e.g. a trained demo model);
``dspark`` when it has DSpark stages (a V4.1 checkpoint with ``mtp.*`` and ``dspark_block_size``; ``k`` up to
the block size, larger ``k`` are skipped).
Greedy output is checked to equal the plain run for every configuration.

``--temperature T`` (> 0) samples instead (seeded per prompt): then MTP runs twice, with its drafts sampled
from the MTP head's distribution and verified by rejection sampling on that ``q``
(``draft_sampling="sample"``, the default) and with argmax drafts verified as one-hot
(``draft_sampling="greedy"``); sampled output is not compared token for token (only its distribution is
the plain run's).

Usage: ``python benchmarks/spec_decode.py [--model PATH] [--ks 1 2 4 8] [--max-tokens 96]
[--methods ngram mtp dspark] [--temperature 0] [--max-model-len 1024]``
(no ``--model``: the built-in demo checkpoint).
"""

from __future__ import annotations

import argparse
import time

from deepinfer_core import LLM, SamplingParams

PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
    "    return a * b\n\n\ndef div(a, b):\n    return a / b\n\n\ndef add(a, b):\n",
    "colors = ['red', 'green', 'blue', 'red', 'green', 'blue', 'red', 'green', 'blue', 'red', ",
    "import os\nimport sys\nimport re\nimport os\nimport sys\nimport re\nimport os\nimport ",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the",
]


def run(
    model: str | None, spec: dict | None, max_tokens: int, temperature: float = 0.0, max_model_len: int = 1024
) -> dict:
    kw = {"max_model_len": max_model_len, "max_num_batched_tokens": 2048, "enable_prefix_caching": False}
    llm = LLM(model, speculative_config=spec, **kw) if model else LLM(speculative_config=spec, **kw)
    engine, steps = llm.engine, [0]
    inner = engine.step

    def counted():
        steps[0] += 1
        return inner()

    engine.step = counted
    tokens, t0 = [], time.perf_counter()
    for i, p in enumerate(PROMPTS):
        sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=i, ignore_eos=True)
        tokens.append(llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids)
    wall = time.perf_counter() - t0
    stats = llm.get_stats()
    n_out = sum(map(len, tokens))
    return {
        "tokens": tokens,
        "decode_steps": steps[0] - len(PROMPTS),  # one prefill step per prompt
        "steps_per_token": steps[0] / n_out,
        "wall": wall,
        "stats": stats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--methods",
        nargs="+",
        default=["ngram", "mtp", "dspark"],
        help="mtp / dspark run only with their weights",
    )
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args()

    base = run(args.model, None, args.max_tokens, args.temperature, args.max_model_len)
    probe = LLM(args.model, max_model_len=64) if args.model else LLM(max_model_len=64)
    model = probe.engine.model
    has = {"mtp": model.num_mtp_layers, "dspark": model.num_dspark_stages}
    block = model.dspark_block_size
    methods = [m for m in args.methods if has.get(m, 1)]
    del probe, model
    how = f"temperature {args.temperature}, seeded" if args.temperature else "greedy"
    print(
        f"model: {args.model or 'built-in demo'}; {len(PROMPTS)} prompts alone, {how}, {args.max_tokens} tokens"
    )
    print(f"plain: {base['steps_per_token']:.3f} target steps/token, wall {base['wall']:.2f}s")
    head = "| method | k | drafted | accepted | mean acceptance length | acceptance per position | steps/token | step speedup | wall (s) |"
    print(head)
    print("|" + "---|" * 9)
    variants = []
    for method in methods:
        if method in ("mtp", "dspark") and args.temperature:
            variants += [(method, {"draft_sampling": "sample"}), (method, {"draft_sampling": "greedy"})]
        elif method == "ngram":
            variants.append(("ngram", {"prompt_lookup_min": 1, "prompt_lookup_max": 4}))
        else:
            variants.append((method, {}))
    for method, extra in variants:
        name = method + (f" ({extra['draft_sampling']} drafts)" if "draft_sampling" in extra else "")
        for k in args.ks:
            if method == "dspark" and k > block:
                continue
            spec = {"method": method, "num_speculative_tokens": k, **extra}
            r = run(args.model, spec, args.max_tokens, args.temperature, args.max_model_len)
            if not args.temperature:
                assert r["tokens"] == base["tokens"], f"{name} k={k}: greedy output changed"
            s = r["stats"]
            per = " ".join(f"{a:.2f}" for a in s["spec_acceptance_per_position"])
            print(
                f"| {name} | {k} | {s['spec_num_draft_tokens']} | {s['spec_num_accepted_tokens']} | "
                f"{s['spec_mean_acceptance_length']:.2f} | {per} | {r['steps_per_token']:.3f} | "
                f"{base['steps_per_token'] / r['steps_per_token']:.2f}x | {r['wall']:.2f} |"
            )


if __name__ == "__main__":
    main()
