"""MTP on the GPU: the V4-Flash-shaped slice with one MTP module, its graphed decode, verify and draft steps
timed side by side, and greedy generation with MTP on equal to the reference backend without it.

Run from the repository root (as ``v4_slice.py``):

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100:plugins/deepinfer_spec_decode:plugins/deepinfer_structured \\
        python benchmarks/gpu/mtp_steps.py [--sections greedy steps] [--batches 1 16 64] [--out DIR]

Sections:

- ``greedy``: a tiny random V4 checkpoint with random ``mtp.0.*`` weights, float32; the reference backend
  without speculation against ``cuda_sm100`` with MTP k = 1..3, graphed; every token and logprob must be equal.
  Reports how many verify (rows per sequence > 1) and draft graphs were captured: MTP decode runs graphed.
- ``steps``: the slice (``--layers`` layers + one MTP module, bf16) at context ``--context``; per batch, the
  graphed step times of: a plain decode step (1 row per sequence), a verify step with k drafts (1 + k rows
  per sequence), the MTP module's chained draft step (1 row) and its catch-up over 1 + k verified rows, each
  through the engine's runner and its graph cache, as the engine runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
from bench_common import RESULTS, SMOKE, cuda_runtime, log, make_llm, sync, time_call
from slice_model import SliceRunner, build_slice


def section_greedy(args) -> None:
    import random
    import tempfile

    from deepinfer_core import SamplingParams
    from tests.models.deepseek_v4.test_mtp import MTPReference
    from tests.models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf, save_deepseek

    hf = build_hf(Schedule("mtp", (CSA, HCA)), seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="v4mtp_"))
    path = str(save_deepseek(hf, tmp, extra=MTPReference(hf).deepseek_tensors()))
    rng = random.Random(11)
    prompts = [{"prompt_token_ids": [rng.randrange(2, 320) for _ in range(n)]} for n in (1, 7, 16, 33, 90)]
    sp = SamplingParams(max_tokens=24, temperature=0.0, logprobs=1, ignore_eos=True)
    kw = dict(max_model_len=256, kv_cache_memory_bytes=128 << 20, dtype="float32")
    ref = make_llm(path, "reference", **kw).generate(prompts, sp, use_tqdm=False)
    out = {}
    for k in (1, 2, 3):
        spec = {"method": "mtp", "num_speculative_tokens": k}
        llm = make_llm(path, "reference" if SMOKE else "cuda_sm100", speculative_config=spec, **kw)
        got = llm.generate(prompts, sp, use_tqdm=False)
        equal = all(r.outputs[0].token_ids == g.outputs[0].token_ids for r, g in zip(ref, got, strict=True))
        diff = max(
            (
                abs(a[t].logprob - b[t].logprob)
                for r, g in zip(ref, got)
                for a, b in zip(r.outputs[0].logprobs, g.outputs[0].logprobs)
                for t in a.keys() & b.keys()
            ),
            default=0.0,
        )
        keys = list(llm.engine.runner.graphs)
        stats = llm.get_stats()
        out[f"k{k}"] = {
            "tokens_equal": equal,
            "max_logprob_diff": diff,
            "verify_graphs": sum(1 for key in keys if key[0] != "draft" and key[2] > 1),
            "decode_graphs": sum(1 for key in keys if key[0] != "draft" and key[2] == 1),
            "draft_graphs": sum(1 for key in keys if key[0] == "draft"),
            "accepted": stats["spec_num_accepted_tokens"],
            "drafted": stats["spec_num_draft_tokens"],
        }
        log("greedy mtp", k, out[f"k{k}"])
    RESULTS["greedy_mtp"] = out


def _seqs(sr: SliceRunner, batch: int, last: int) -> list:
    """``batch`` sequences whose positions up to ``last`` have window and compressed blocks (as the KV
    manager would hand them out: the window ring of 3 blocks, every compressed block)."""
    ncol = last // sr.bs + 1
    seqs = []
    for b in range(batch):
        win = [-1] * ncol
        for c in range(max(0, ncol - sr.win_blocks), ncol):
            win[c] = b * sr.win_blocks + (c % sr.win_blocks)
        cmp = [b * sr.cmp_blocks + c for c in range(ncol)]
        seqs.append(SimpleNamespace(block_tables={"window": win, "compressed": cmp}))
    return seqs


def _mtp_fn(model, runner, module: int):
    def step(batch, prev, last):
        out = model.mtp_forward(module, batch, prev, runner.kv)
        tail = out.index_select(0, last)
        return tail, torch.argmax(model.mtp_compute_logits(module, tail), dim=-1)

    return step


def _static(sr: SliceRunner, seqs, starts, q: int, draft: bool, dev):
    model, runner = sr.model, sr.runner
    ids = [[3 + i % 100] * q for i in range(len(seqs))]
    b = runner.static_batch(seqs, starts, ids)
    plan = model.plan_draft if draft else model.plan
    b.plan = plan(b, b.graph_key[1])
    return b.to(dev)


def _row(sr: SliceRunner, batch: int, ctx: int, ks: list[int], dev) -> dict:
    runner, model = sr.runner, sr.model
    row = {"batch": batch, "context": ctx}
    seqs = _seqs(sr, batch, ctx - 1 + max(ks) + 1)
    dec = _static(sr, seqs, [ctx - 1] * batch, 1, False, dev)
    row["decode_ms"] = time_call(lambda: runner.run(dec))
    hidden = runner.last_hidden
    fn = _mtp_fn(model, runner, 0)
    for k in ks:
        ver = _static(sr, seqs, [ctx - 1] * batch, 1 + k, False, dev)
        row[f"verify_k{k}_ms"] = time_call(lambda ver=ver: runner.run(ver))
        cu = _static(sr, seqs, [ctx - 1 - k] * batch, 1 + k, True, dev)
        prev = hidden[:1].expand(cu.input_ids.shape[0], *hidden.shape[1:]).contiguous()
        last = torch.arange(cu.query_start_loc.shape[0] - 1, device=dev) * (1 + k) + k
        row[f"catchup_k{k}_ms"] = time_call(
            lambda cu=cu, prev=prev, last=last: runner.run_static(("draft", 0), fn, cu, prev, last)
        )
    dr = _static(sr, seqs, [ctx] * batch, 1, True, dev)
    prev = hidden[: dr.input_ids.shape[0]].contiguous()
    last = torch.arange(dr.input_ids.shape[0], device=dev)
    row["draft_step_ms"] = time_call(lambda: runner.run_static(("draft", 0), fn, dr, prev, last))
    row["graphs"] = len(runner.graphs)
    return row


def section_steps(args) -> None:
    from cuda_settings import cuda_env

    from deepinfer_core.config import load_config
    from deepinfer_core.runtime import build_runtime

    dev = torch.device("cpu" if SMOKE else "cuda")
    rt = (
        build_runtime(load_config(environ={}, backend="reference"))
        if SMOKE
        else cuda_runtime(load_config(environ=cuda_env(), backend="cuda_sm100"))
    )
    model = build_slice(args.layers, rt.backends, toy=SMOKE, mtp=1)
    sync()
    sr = SliceRunner(model, rt.backends, max(args.batches), args.context + 256, graphs=True)
    sr.runner.tap_hidden = True  # as with MTP on: the hidden states are a graph output
    rows = []
    for b in args.batches:
        try:
            with torch.inference_mode():  # as the engine runs its steps
                rows.append(_row(sr, b, args.context, args.ks, dev))
        except Exception as e:  # noqa: BLE001 - report and go on
            rows.append({"batch": b, "error": f"{type(e).__name__}: {e}"[:300]})
            log(traceback.format_exc()[-2000:])
        log("mtp steps", rows[-1])
    RESULTS["mtp_steps"] = {"layers": args.layers, "mtp_modules": 1, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", nargs="+", default=["greedy", "steps"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU reference backend")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    RESULTS["meta"] = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "argv": sys.argv,
    }
    for s in args.sections:
        try:
            globals()[f"section_{s}"](args)
        except Exception:  # noqa: BLE001 - one section's failure must not hide the others
            log(f"section {s} failed:\n{traceback.format_exc()[-3000:]}")
            RESULTS.setdefault("errors", {})[s] = traceback.format_exc()[-1500:]
        with open(os.path.join(args.out, "mtp_steps.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


if __name__ == "__main__":
    main()
