"""Train the V4.1 demo model: a tiny DeepSeek-V4.1-architecture model with Engram and a DSpark head, on the
same corpus and tokenizer as the V4 demo (``tools/train_demo.py prepare``).

Reproducible recipe (every number is recorded in the output's ``training.json``):

1. ``python tools/train_demo.py prepare --out DATA`` (CPU): the CPython standard library, held-out split and
   byte-level BPE tokenizer of the V4 demo. The V4.1 demo adds DSpark's noise token as the last id.
2. ``python tools/train_demo_v41.py train --data DATA --out CKPT`` (GPU): the engine's own V4.1 model
   (:mod:`v41demo.train`; configuration ``v41demo.train.SPEC``) trained on batched, differentiable twins of
   the reference ops (:mod:`v41demo.ops`): next-token loss plus DSpark's block loss and confidence loss on the
   target's detached taps. Then held-out loss and bits per byte of the float model and of the exported one.
3. Export in DeepSeek's published V4.1 layout with the project's own quantisers: FP8 e4m3 weights in 32x32
   blocks with ue8m0 scales, FP4 e2m1 routed experts, FP8 Engram rows; BF16 embeddings, head and norms.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from v41demo import train as v41  # noqa: E402


def run(data: Path, out: Path, device: torch.device) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(v41.TRAIN["seed"])
    meta = json.loads((data / "data.json").read_text())
    bpt = meta["bytes"]["heldout"] / meta["tokens"]["heldout"]
    t = v41.build(data / "tokenizer" / "tokenizer.json", out, device)
    record = v41.train(t, data, device, v41.TRAIN, log=lambda s: print(s, flush=True))
    held = torch.load(data / "heldout.pt")
    record["heldout_float"] = v41.evaluate(t, held, bpt, device)
    print(json.dumps({"heldout_float": record["heldout_float"]}), flush=True)
    record["bytes"] = v41.export(t, out)
    # the exported (FP8 / FP4 / FP8-rows) weights, read back through the engine's loader
    q = v41.load_exported(out, t.args, t.tokenizer, device)
    record["heldout_exported"] = v41.evaluate(q, held, bpt, device)
    print(json.dumps({"heldout_exported": record["heldout_exported"]}), flush=True)
    record.update({"spec": v41.configs.as_dict(v41.SPEC), "train": dict(v41.TRAIN), "data": meta,
                   "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "torch": torch.__version__})  # fmt: skip
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--device", default="cuda")
    t.add_argument("--steps", type=int, default=None, help="override the step count (smoke runs)")
    t.add_argument("--batch", type=int, default=None, help="override the batch size (smoke runs)")
    t.add_argument("--seq-len", type=int, default=None, help="override the sequence length (smoke runs)")
    t.add_argument("--time-cap", type=float, default=None, help="stop after this many seconds of training")
    ns = ap.parse_args()
    over = {"steps": ns.steps, "batch": ns.batch, "seq_len": ns.seq_len, "time_cap_s": ns.time_cap}
    v41.TRAIN.update({k: v for k, v in over.items() if v})
    run(ns.data, ns.out, torch.device(ns.device))


if __name__ == "__main__":
    main()
