"""DeepSeek's reference outputs on the shipped V4.1 demo checkpoint (``deepinfer_core/demo_model_v41``).

    python tools/v41_demo_goldens.py --reference .v41ref --out tests/data/v41_demo

The reference (set up as ``docs/v41_reference.md`` says) is built from the demo's stored tensors and
``inference/config.json`` exactly as ``tools/v41_goldens.py`` builds it for the tiny random checkpoints, and
records, in the same formats (:mod:`v41golden.runs`, :mod:`v41golden.dspark`):

- ``prompts.safetensors``: ``prompt.<i>.ids`` and ``<mode>.<i>.<field>`` for the modes ``exact`` (unquantized
  KV) and ``kvq_only`` (the release's FP8 / FP4 KV round trips, float32 GEMMs): prompt logprobs and 16 greedy
  tokens. The prompts are code: a short one and three held-out files of the standard library (CPython 3.11,
  the training split's rule), cut to 64, 200 and 600 tokens (past the 64-token window, the compression
  groups and the candidate pool);
- ``dspark.safetensors``: DSpark's draft blocks (ids, logprobs, confidence) after two contexts, ``exact``;
- ``goldens.json``: lengths, modes and the provenance (the reference's sha256, the checkpoint's sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from v41demo.train import stored_tensors  # noqa: E402
from v41golden import dspark, patches, runs  # noqa: E402
from v41golden.files import provenance, sha256_file, write_json, write_tensors  # noqa: E402
from v41golden.reference import build, load_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "deepinfer_core" / "demo_model_v41"
COMMAND = "python tools/v41_demo_goldens.py --reference <REF> --out tests/data/v41_demo"
MODES = ("exact", "kvq_only")
GREEDY = 16
#: held-out standard-library files (sha1(path) % 20 == 0) and how many tokens of each make a prompt
HELDOUT = (("base64.py", 64), ("copy.py", 200), ("difflib.py", 600))
SHORT = "def quicksort(xs):\n"
DSPARK_CONTEXTS = (("enum.py", 150), ("gzip.py", 300))
DSPARK_STEPS = 3


def tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast

    cfg = json.loads((path / "tokenizer_config.json").read_text())
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"), bos_token=cfg["bos_token"], eos_token=cfg["eos_token"]
    )


def heldout_ids(tok, rel: str, n: int) -> list[int]:
    if int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20:
        raise SystemExit(f"{rel} is not a held-out file of the demo's training split")
    text = (Path(sysconfig.get_paths()["stdlib"]) / rel).read_text(encoding="utf-8")
    return [tok.bos_token_id, *tok(text, add_special_tokens=False).input_ids[: n - 1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "v41_demo")
    ap.add_argument("--allow-other-reference", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    ref = load_reference(args.reference, args.allow_other_reference)
    tok = tokenizer(CHECKPOINT)
    inference = json.loads((CHECKPOINT / "inference" / "config.json").read_text())
    stored = stored_tensors(CHECKPOINT)
    max_len = 1024

    def fresh():
        return build(ref, inference, tok, stored, max_len)

    prompts = [[tok.bos_token_id, *tok(SHORT, add_special_tokens=False).input_ids]]
    prompts += [heldout_ids(tok, rel, n) for rel, n in HELDOUT]
    out = {f"prompt.{i}.ids": torch.tensor(ids) for i, ids in enumerate(prompts)}
    for mode in MODES:
        for i, ids in enumerate(prompts):
            model = fresh()
            with patches.numerics(ref, mode):
                got = runs.prompt_and_greedy(model, ref, ids, GREEDY)
            out.update({f"{mode}.{i}.{k}": v for k, v in got.items()})
            print(mode, i, len(ids), flush=True)
    contexts = [heldout_ids(tok, rel, n) for rel, n in DSPARK_CONTEXTS]
    drafts = {f"context.{c}.ids": torch.tensor(ids) for c, ids in enumerate(contexts)}
    for c, ids in enumerate(contexts):
        model = fresh()
        with patches.numerics(ref, "exact"):
            got = dspark.drafts(model, ids, DSPARK_STEPS)
        drafts.update({f"exact.{c}.{k}": v for k, v in got.items()})
    files = {f.name: sha256_file(f) for f in sorted(CHECKPOINT.glob("*.safetensors"))}
    prov = provenance(ref.sha256, COMMAND, None, {"checkpoint_sha256": files, "inference_config": inference})
    args.out.mkdir(parents=True, exist_ok=True)
    write_tensors(args.out / "prompts.safetensors", out, prov)
    write_tensors(args.out / "dspark.safetensors", drafts, prov)
    write_json(args.out / "goldens.json", {
        "checkpoint": "deepinfer_core/demo_model_v41", "modes": list(MODES), "greedy_tokens": GREEDY,
        "prompt_lengths": [len(p) for p in prompts], "prompt_sources": ["short"] + [r for r, _ in HELDOUT],
        "dspark_context_lengths": [len(c) for c in contexts], "dspark_steps": DSPARK_STEPS,
        "topk": {"prompts": runs.TOPK, "dspark": dspark.TOPK}, "provenance": prov,
    })  # fmt: skip
    print(args.out)


if __name__ == "__main__":
    main()
