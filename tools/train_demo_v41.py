"""Train the V4.1 demo model: a tiny DeepSeek-V4.1-architecture model with Engram and a DSpark head, on the
same corpus and tokenizer as the V4 demo (``tools/train_demo.py prepare``).

Reproducible recipe (every number is recorded in the output's ``training.json``):

1. ``python tools/train_demo.py prepare --out DATA`` (CPU): the CPython standard library, held-out split and
   byte-level BPE tokenizer of the V4 demo. The V4.1 demo adds DSpark's noise token as the last id.
2. ``python tools/train_demo_v41.py train --data DATA --out CKPT`` (GPU): the engine's own V4.1 model
   (:mod:`v41demo.train`; configuration ``v41demo.train.SPEC``) trained on batched, differentiable twins of
   the reference ops (:mod:`v41demo.ops`): next-token loss plus DSpark's block loss and confidence loss on the
   target's detached taps. Then held-out loss and bits per byte of the float model and of the exported one.
3. ``python tools/train_demo_v41.py finetune-dspark --data DATA --src CKPT --out CKPT2`` (GPU): the DSpark
   stages alone trained on (more draft blocks a step, the target frozen and copied unchanged).
4. Export in DeepSeek's published V4.1 layout with the project's own quantisers: FP8 e4m3 weights in 32x32
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


def run(data: Path, out: Path, device: torch.device, init: Path | None = None) -> dict:
    """Train (from random weights, or from the checkpoint ``init``), evaluate, export."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(v41.TRAIN["seed"])
    meta = json.loads((data / "data.json").read_text())
    bpt = meta["bytes"]["heldout"] / meta["tokens"]["heldout"]
    t = v41.build(data / "tokenizer" / "tokenizer.json", out, device)
    previous = None
    if init is not None:
        previous = json.loads((init / "training.json").read_text())
        v41.warm_start(t, init)
    record = v41.train(t, data, device, v41.TRAIN, v41.WEIGHTS, log=lambda s: print(s, flush=True))
    held = torch.load(data / "heldout.pt")
    record["heldout_float"] = v41.evaluate(t, held, bpt, device)
    print(json.dumps({"heldout_float": record["heldout_float"]}), flush=True)
    record["bytes"] = v41.export(t, out)
    # the exported (FP8 / FP4 / FP8-rows) weights, read back through the engine's loader
    q = v41.load_exported(out, t.args, t.tokenizer, device)
    record["heldout_exported"] = v41.evaluate(q, held, bpt, device)
    print(json.dumps({"heldout_exported": record["heldout_exported"]}), flush=True)
    if previous is not None:
        record["previous"] = previous  # the run this one started from
    record.update({"spec": v41.configs.as_dict(v41.SPEC), "train": dict(v41.TRAIN), "data": meta,
                   "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "torch": torch.__version__})  # fmt: skip
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def finetune_dspark(data: Path, src: Path, out: Path, device: torch.device) -> dict:
    """Stage 2: the DSpark stages of the checkpoint at ``src`` trained on, the target frozen; every other
    stored tensor is copied unchanged into ``out``."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(v41.DRAFT["seed"])
    meta = json.loads((data / "data.json").read_text())
    bpt = meta["bytes"]["heldout"] / meta["tokens"]["heldout"]
    held = torch.load(data / "heldout.pt")
    t = v41.draft_trainee(src, device)
    before = v41.evaluate(t, held, bpt, device)
    print(json.dumps({"heldout_before": before}), flush=True)
    stage = v41.train(t, data, device, v41.DRAFT, v41.DRAFT_WEIGHTS, log=lambda s: print(s, flush=True))
    base = v41.stored_tensors(src)
    record = json.loads((src / "training.json").read_text())
    record["bytes"] = v41.export(t, out, base)
    q = v41.load_exported(out, t.args, t.tokenizer, device)
    stage.update({"draft": dict(v41.DRAFT), "heldout_before": before,
                  "heldout_exported": v41.evaluate(q, held, bpt, device)})  # fmt: skip
    print(json.dumps({"heldout_exported": stage["heldout_exported"]}), flush=True)
    record["dspark_stage"] = stage
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
    t.add_argument(
        "--init", type=Path, default=None, help="start from this exported checkpoint (a later stage)"
    )
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--warmup", type=int, default=None)
    f = sub.add_parser(
        "finetune-dspark", help="stage 2: train the DSpark stages of CKPT on, the target frozen"
    )
    f.add_argument("--data", type=Path, required=True)
    f.add_argument("--src", type=Path, required=True)
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--device", default="cuda")
    f.add_argument("--steps", type=int, default=None)
    f.add_argument("--batch", type=int, default=None)
    f.add_argument("--seq-len", type=int, default=None)
    f.add_argument("--time-cap", type=float, default=None)
    ns = ap.parse_args()
    over = {"steps": ns.steps, "batch": ns.batch, "seq_len": ns.seq_len, "time_cap_s": ns.time_cap}
    over = {k: v for k, v in over.items() if v}
    if ns.cmd == "train":
        over.update({k: v for k, v in (("lr", ns.lr), ("warmup", ns.warmup)) if v})
        v41.TRAIN.update(over)
        run(ns.data, ns.out, torch.device(ns.device), ns.init)
    else:
        v41.DRAFT.update(over)
        v41.TRAIN.update({k: v for k, v in over.items() if k == "seq_len"})
        finetune_dspark(ns.data, ns.src, ns.out, torch.device(ns.device))


if __name__ == "__main__":
    main()
