"""DeepSeek's V4.1 reference inference on the V4.1-Flash-shaped slice, beside the engine (issue #27).

Runs the release's ``inference/model.py`` and ``engram.py`` (checked by sha256, from a git-ignored folder; see
``docs/v41_reference.md``) with ``kernel_cpu.py``, the PyTorch stand-in for DeepSeek's TileLang kernels (the
TileLang ``inference/kernel.py`` is not published where this workplace can read it), on the slice of
``v41_slice.py``: its config rendered in ``ModelArgs`` names, the same random weights (each tensor drawn from a
generator seeded by its name, ``slice_model41.RandomReader41.get``) and the same Engram table file. The model runs as the
release does: bf16 default dtype on the GPU, prefill of the whole prompt in one forward, then one token a step
for the whole batch, greedy (``temperature = 0``), KV quantisation simulated in place, the decode fix of
``docs/v41_reference.md`` on. Per batch and numerics mode (``--modes``: the release's, and float32 GEMMs like
the engine's, for the token comparison) it records the median decode step (ms, CUDA-synchronised), tokens
per second and the greedy tokens.

The engine's side is ``v41_slice.py --ks 0 --save-tokens`` on the same prompts (``slice_prompts``); with
``--engine-json`` this script adds, per batch, the engine's step and the share of greedy tokens the two agree on
(position by position until the first difference, and overall).

    python3 benchmarks/gpu/v41_reference_peer.py --reference .v41ref --batches 1 32 --tokens 32 [--smoke]
    run (carry [".whl", ".v41ref"]): the same on the H200 after v41_slice.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "tools")]

from slice_model41 import DEMO_CONFIG, RandomReader41, slice_config, slice_prompts, write_engram_file  # noqa: E402
from v41golden import patches  # noqa: E402
from v41golden.hf_config import TEXT_TO_ARGS  # noqa: E402
from v41golden.reference import _stored_value, load_reference  # noqa: E402

ROPE_ARGS = {"factor": "rope_factor", "original_max_position_embeddings": "original_seq_len"}


def reference_args(toy: bool) -> dict:
    """``ModelArgs`` values of the slice: the demo's ``inference/config.json`` with the slice's widths."""
    args = json.loads((DEMO_CONFIG.parent / "inference" / "config.json").read_text())
    text = slice_config(toy)["text_config"]
    for key, value in text.items():
        if key in TEXT_TO_ARGS:
            args[TEXT_TO_ARGS[key]] = value
        elif key.startswith(("engram_", "dspark_")):
            args[key] = value
        elif key == "rope_scaling":
            for k, v in value.items():
                if k in ROPE_ARGS or k in ("beta_fast", "beta_slow"):
                    args[ROPE_ARGS.get(k, k)] = v
    n_mtp = args["n_mtp_layers"]
    args["compress_ratios"] = list(text["compress_ratios"])[: args["n_layers"]] + [0] * n_mtp
    return args


class SliceTensors:
    """The slice's stored tensors by name, made on demand (random ones from ``RandomReader41``, the Engram
    table from its file)."""

    def __init__(self, reader: RandomReader41, engram: dict[str, torch.Tensor]):
        self.reader, self.engram = reader, engram

    def __contains__(self, name: str) -> bool:
        return name in self.reader.meta

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.engram:
            return self.engram[name].to(self.reader.device)
        return self.reader.get(name)

    def __iter__(self):
        return iter(self.reader.meta)


def build_reference(ref, args: dict, tensors: SliceTensors, batch: int, max_len: int, device, dtype):
    """The release's ``Transformer`` on ``device`` in ``dtype``, filled parameter by parameter (the empty
    parameter's memory goes as its tensor arrives), every stored tensor used."""
    import deepseek_v41_reference.engram as ref_engram  # noqa: F401 - imported by load_reference

    vocab, compressed = args["vocab_size"], args["engram_compressed_vocab_size"]
    # no tokenizer: ids map onto the compressed vocabulary by residue, as in the engine's slice
    ref.engram.build_compressed_token_map = lambda tok: ([i % compressed for i in range(vocab)], compressed)
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    margs = ref.model.ModelArgs(**fields, max_batch_size=batch, max_seq_len=max_len, temperature=0)
    prev_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = ref.model.Transformer(margs, None)
    finally:
        torch.set_default_dtype(prev_dtype)
    used: set[str] = set()
    for name, p in model.named_parameters():
        value = _stored_value(name, p, tensors, used)
        if value.shape != p.shape:
            raise ValueError(f"{name}: slice {tuple(value.shape)}, reference {tuple(p.shape)}")
        p.data = value.to(device)
        used.add(name)
    if (
        dtype == torch.float32
    ):  # activations in float32 (--smoke): widen the bf16 parameters, as the goldens do
        for p in model.parameters():
            if p.dtype == torch.bfloat16:
                p.data = p.data.float()
    unused = sorted(set(tensors) - used)
    if unused:
        raise KeyError(f"slice tensors the reference does not use: {unused[:8]}")
    return model.eval()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_batch(model, prompts: list[list[int]], tokens: int, device, dtype) -> dict:
    """Prefill every prompt in one forward, then ``tokens - 1`` decode steps of the whole batch, with the default
    device and dtype the release's ``generate.py`` sets (the stand-in kernels make their tensors there)."""
    ids = torch.tensor(prompts, device=device)
    start = ids.shape[1]
    prev_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return _run(model, ids, start, tokens, device)
    finally:
        torch.set_default_dtype(prev_dtype)


def _run(model, ids: torch.Tensor, start: int, tokens: int, device) -> dict:
    with torch.inference_mode():
        out = [model(ids, 0)[0]]
        steps = []
        for i in range(tokens - 1):
            sync(device)
            t0 = time.perf_counter()
            out.append(model(out[-1][:, None], start + i)[0])
            sync(device)
            steps.append((time.perf_counter() - t0) * 1e3)
    step = statistics.median(steps) if steps else float("nan")
    return {
        "batch": ids.shape[0],
        "step_ms": step,
        "tok_s": ids.shape[0] / step * 1e3,
        "tokens": torch.stack(out, 1).tolist(),
    }


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """Greedy agreement: tokens equal before each sequence's first difference, and equal overall."""
    prefix = total = equal = 0
    for a, b in zip(ours, theirs, strict=True):
        n = min(len(a), len(b))
        first = next((i for i in range(n) if a[i] != b[i]), n)
        prefix += first
        equal += sum(a[i] == b[i] for i in range(n))
        total += n
    return {"prefix_share": prefix / total, "equal_share": equal / total, "tokens": total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, default=ROOT / ".v41ref")
    ap.add_argument("--allow-other-reference", action="store_true")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["kvq_on", "kvq_only"],
        choices=["kvq_on", "kvq_only", "exact", "kvq_off"],
        help="the reference's numerics (v41golden.patches.MODES): kvq_on is the release's (FP8 activations in "
        "every GEMM, KV formats simulated); kvq_only computes the GEMMs in float32 as the engine does",
    )
    ap.add_argument(
        "--engine-json", type=Path, help="v41_slice.py's JSON of the same prompts (--save-tokens)"
    )
    ap.add_argument("--smoke", action="store_true", help="the demo's widths on the CPU, float32")
    ap.add_argument(
        "--float32",
        action="store_true",
        help="activations in float32 on the GPU too (against v41_slice.py --float32: greedy tokens, not speed)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if args.smoke or args.float32 else torch.bfloat16
    ref = load_reference(args.reference, args.allow_other_reference)
    rargs = reference_args(args.smoke)
    result: dict = {"meta": {"argv": sys.argv, "device": str(device), "dtype": str(dtype), "torch": torch.__version__,
                             "reference_sha256": ref.sha256, "kernels": "kernel_cpu.py (PyTorch stand-in)"},
                    "args": rargs, "rows": []}  # fmt: skip
    engine = json.loads(args.engine_json.read_text()) if args.engine_json else None
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="v41peer_") as tmp:
        from safetensors.torch import load_file

        from deepinfer_core.models.deepseek_v41.model import DeepseekV41ForCausalLM, read_config

        (Path(tmp) / "config.json").write_text(json.dumps(slice_config(args.smoke)))
        shapes = DeepseekV41ForCausalLM(read_config(Path(tmp)), None, dtype, True)  # slots only: no weights
        reader = RandomReader41(shapes, Path(tmp), device)
        write_engram_file(reader)
        tensors = SliceTensors(reader, load_file(str(Path(tmp) / reader.ENGRAM_FILE)))
        for b, mode in ((b, m) for b in args.batches for m in args.modes):
            model = build_reference(ref, rargs, tensors, b, args.prompt + args.tokens, device, dtype)
            prompts = slice_prompts(b, args.prompt, rargs["vocab_size"])
            with patches.numerics(ref, mode):
                row = {"numerics": mode, **run_batch(model, prompts, args.tokens, device, dtype)}
            if engine is not None:
                mine = engine.get("tokens", {}).get(str(b))
                erow = next((r for r in engine["engine"]["rows"] if r["batch"] == b), None)
                if mine is not None:
                    row["agreement"] = agreement(mine, [t[: len(m)] for t, m in zip(row["tokens"], mine)])
                if erow is not None:
                    row["engine_step_ms"] = erow["plain"]["step_ms"]
                    row["reference_over_engine"] = row["step_ms"] / erow["plain"]["step_ms"]
            print("reference", {k: v for k, v in row.items() if k != "tokens"}, flush=True)
            result["rows"].append(row)
            with open(os.path.join(args.out, "v41_reference_peer.json"), "w") as f:
                json.dump(result, f, indent=1)
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
