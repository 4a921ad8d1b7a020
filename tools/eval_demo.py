"""Held-out loss and bits per byte of the demo models, through the engine.

    python tools/eval_demo.py [--files 8] [--chars 4000]          # the V4 demo: BF16, FP8, FP4 experts
    python tools/eval_demo.py --mtp                               # the V4 demo's MTP acceptance, k = 1..3
    python tools/eval_demo.py --v41                               # the V4.1 demo: trained FP8/FP4 KV and unquantized
    python tools/eval_demo.py --dspark                            # the V4.1 demo's DSpark acceptance, k = 1..5

The held-out files are the ones ``tools/train_demo.py prepare`` set aside (sha1(path) % 20 == 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sysconfig
import tempfile
import time
from pathlib import Path

from deepinfer_core import LLM
from deepinfer_core.demo import DEMO_DIR
from deepinfer_core.evaluation import heldout_score
from deepinfer_core.models.deepseek_v4.convert import quantize_checkpoint


def heldout_texts(n: int, chars: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*.py") if "site-packages" not in p.parts
    )
    held = [r for r in rels if int(hashlib.sha1(r.encode()).hexdigest(), 16) % 20 == 0]
    return [(root / r).read_text(encoding="utf-8", errors="replace")[:chars] for r in held[:n]]


def mtp_acceptance(
    texts: list[str], k: int, prompt_tokens: int = 128, max_tokens: int = 48, method: str = "mtp"
) -> dict:
    """Greedy generation from held-out prompts with MTP (the V4 demo) or DSpark (the V4.1 demo) drafting;
    the engine's acceptance counters."""
    from deepinfer_core import SamplingParams

    llm = LLM(
        str(DEMO_DIR) if method == "mtp" else "demo",
        kv_cache_memory_bytes=64 << 20,
        speculative_config={"method": method, "num_speculative_tokens": k},
    )
    tok = llm.get_tokenizer()
    prompts = [
        {"prompt_token_ids": [tok.bos_token_id, *tok(t, add_special_tokens=False).input_ids[:prompt_tokens]]}
        for t in texts
    ]
    llm.generate(
        prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), use_tqdm=False
    )
    st = llm.get_stats()
    return {
        "k": k,
        "draft_tokens": st["spec_num_draft_tokens"],
        "accepted_tokens": st["spec_num_accepted_tokens"],
        "acceptance_rate": round(st["spec_num_accepted_tokens"] / max(1, st["spec_num_draft_tokens"]), 4),
        "mean_acceptance_length": round(st["spec_mean_acceptance_length"], 3),
        "acceptance_per_position": [round(x, 3) for x in st["spec_acceptance_per_position"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--chars", type=int, default=4000)
    ap.add_argument("--mtp", action="store_true", help="measure MTP acceptance for k = 1, 2, 3 instead")
    ap.add_argument("--v41", action="store_true", help="score the V4.1 demo instead")
    ap.add_argument("--dspark", action="store_true", help="measure DSpark acceptance for k = 1..5 instead")
    ns = ap.parse_args()
    texts = heldout_texts(ns.files, ns.chars)
    if ns.mtp or ns.dspark:
        for k in (1, 2, 3) if ns.mtp else (1, 2, 3, 4, 5):
            print(json.dumps(mtp_acceptance(texts, k, method="mtp" if ns.mtp else "dspark")))
        return
    if ns.v41:
        for kv in ("auto", "unquantized"):
            t0 = time.perf_counter()
            s = heldout_score(LLM("demo", kv_cache_memory_bytes=64 << 20, kv_cache_dtype=kv), texts)
            print(json.dumps({"variant": f"v41 demo, kv {kv}", "tokens": s.tokens, "bytes": s.bytes, "loss": round(s.loss, 4),
                              "bits_per_byte": round(s.bits_per_byte, 4), "seconds": round(time.perf_counter() - t0, 1)}))  # fmt: skip
        return
    with tempfile.TemporaryDirectory() as tmp:
        fp8 = quantize_checkpoint(DEMO_DIR, Path(tmp) / "fp8", experts="fp8")
        fp4 = quantize_checkpoint(DEMO_DIR, Path(tmp) / "fp4", experts="fp4")
        for name, path in (("bf16", DEMO_DIR), ("fp8", fp8), ("fp8+fp4 experts", fp4)):
            t0 = time.perf_counter()
            llm = LLM(str(path), kv_cache_memory_bytes=64 << 20)
            s = heldout_score(llm, texts)
            print(json.dumps({"variant": name, "tokens": s.tokens, "bytes": s.bytes, "loss": round(s.loss, 4),
                              "bits_per_byte": round(s.bits_per_byte, 4), "seconds": round(time.perf_counter() - t0, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
