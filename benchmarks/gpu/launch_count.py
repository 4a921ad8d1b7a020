"""How many launches a V4.1 decode step makes per layer on the ``cuda_sm100`` ops, counted on the CPU.

At batch 1 a V4.1 layer of the H200 slice takes 0.355 ms against 0.073 ms of bytes (RESULTS v25): if its kernels
are many and small, the step is bound by their launches and tails, not by the weights' bytes. This counts them
without a GPU: the committed tiny V4.1 checkpoint (``reindex_r2``) runs on the plugin's dense, attention and MoE
ops under the Triton interpreter, dispatched as on the H200 (``arch() == "sm90"``), and one decode step's forward
pass (batch 1, after a prompt) is counted: Triton kernel launches by kernel, and the torch operators that are a
kernel on a GPU (not views, not metadata). ``--step graph`` (the default) counts what the slice's captured decode
step holds: a static batch, the Engram tables read inside the step, the head and its float32 logits, and with
``--device-plan`` the slot plan built in the step (``--step forward``: the forward pass alone). Shapes are tiny, so tile choices can differ from the slice's, but
the launches a layer makes are set by the model's structure and the ops' code, not by the widths.

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python benchmarks/gpu/launch_count.py [--activation-quant fp8]
        [--step graph|forward] [--device-plan]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from op_sites import OpSites, site  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--activation-quant", default="none", choices=["none", "fp8"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--model",
        default="reindex_r2",
        help="a tiny V4.1 checkpoint of tests/models/deepseek_v41 by name, or a checkpoint's path (the V4 demo: "
        "deepinfer_core/demo_model)",
    )
    ap.add_argument(
        "--step",
        default="graph",
        choices=["graph", "forward"],
        help="graph: what the H200's captured decode step runs (a static batch, the Engram tables read inside "
        "the step, the forward pass, the head and its float32 logits); forward: the model's forward pass alone",
    )
    ap.add_argument("--sequence", action="store_true", help="also list one counted step's launches in order")
    ap.add_argument(
        "--device-plan", action="store_true", help="graph: the slot plan built inside the step (device_plan)"
    )
    args = ap.parse_args()

    from triton.runtime import interpreter

    from deepinfer_core import LLM, SamplingParams
    from deepinfer_cuda_sm100 import dispatch
    from deepinfer_cuda_sm100.kernels.host_rows import host_rows
    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps
    from tests.models.deepseek_v41.goldens import checkpoint

    dispatch.arch, dispatch.num_sms = (lambda: "sm90"), (lambda: 132)  # the H200's
    # the PTX FP4 decodes (inside a kernel: the same launches) cannot run under the interpreter: their emulation
    h2 = dispatch.fp4_h2_mode
    dispatch.fp4_decode_ptx = lambda *a, **k: False
    dispatch.pdl_args = lambda *a, **k: {}  # griddepcontrol PTX: an earlier start, not another launch
    dispatch.fp4_h2_mode = lambda *a, **k: min(h2(*a, **k), 1)
    llm = LLM(
        model=args.model if "/" in args.model else str(checkpoint(args.model)),
        dtype=args.dtype,
        kv_cache_dtype="auto",
        max_num_batched_tokens=256,
        activation_quant=args.activation_quant,
    )
    model, runner = llm.engine.model, llm.engine.runner
    if args.step == "graph":  # the captured step's content, not captured: static batches, device-built plans
        memory = model.backends.memory  # and the Engram tables read inside the step, as the slice reads them
        memory.reads_host_memory = True
        memory.host_rows = lambda table, ids: host_rows(table, ids, ids.device)
        if getattr(model, "hasher", None) is not None and not model.place_engram(True):
            raise SystemExit("the Engram tables could not be placed for reads inside the step")
        runner.static_decode(1, capture=False)
        runner.device_plan = args.device_plan and model.device_plan
    model.backends = replace(
        model.backends, dense=CudaDenseOps(), attention=CudaAttentionOps(), moe=CudaMoEOps()
    )
    layers = model.cfg.num_hidden_layers
    triton_launches: Counter = Counter()
    sequence: list[str] = []  # every launch of the counted steps in order, with its caller
    torch_ops = OpSites()
    counting = {"on": False, "steps": 0}
    real_run = interpreter.InterpretedFunction.run

    def run(self, *a, **k):
        if not counting["on"]:
            return real_run(self, *a, **k)
        triton_launches[getattr(self.fn, "__name__", "?")] += 1
        sequence.append(f"{getattr(self.fn, '__name__', '?')}  <- {site(('deepinfer_core/models',))}")
        torch_ops.paused = True
        try:
            return real_run(self, *a, **k)
        finally:
            torch_ops.paused = False

    interpreter.InterpretedFunction.run = run
    owner, attr = (runner, "_forward") if args.step == "graph" else (model, "forward")
    real_forward = getattr(owner, attr)

    def forward(batch, *rest):
        decode = batch.num_tokens == 1
        counting["decodes"] = counting.get("decodes", 0) + decode
        if (
            not decode or counting["decodes"] == 1
        ):  # the first decode step fills per-shape caches once: not counted
            return real_forward(batch, *rest)
        if args.step == "graph" and batch.graph_key is None:
            raise SystemExit("the decode step was not static: nothing the graph would hold was counted")
        counting["on"], counting["steps"] = True, counting["steps"] + 1
        try:
            with torch_ops:
                return real_forward(batch, *rest)
        finally:
            counting["on"] = False

    setattr(owner, attr, forward)
    rng = random.Random(5)
    prompt = {"prompt_token_ids": [rng.randrange(3, 300) for _ in range(24)]}
    llm.generate([prompt], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True), use_tqdm=False)
    steps = counting["steps"]
    t, o = sum(triton_launches.values()) / steps, sum(torch_ops.ops.values()) / steps
    print(
        f"{args.model} ({layers} layers, {model.cfg.hidden_size} wide), {args.dtype}, activation_quant="
        f"{args.activation_quant}, dispatched as sm90; the second decode step's "
        f"{'captured step' if args.step == 'graph' else 'forward pass'} at batch 1 ({steps} steps counted)"
    )
    print(f"Triton launches a step: {t:.0f} ({t / layers:.1f} a layer); torch kernels a step: {o:.0f} "
          f"({o / layers:.1f} a layer); together {(t + o) / layers:.1f} a layer")  # fmt: skip
    print("Triton, by kernel (a step):")
    for k, v in triton_launches.most_common():
        print(f"    {k}: {v / steps:.0f}")
    print("torch, by operator (a step):")
    for k, v in torch_ops.ops.most_common(30):
        print(f"    {k}: {v / steps:.0f}")
    if args.sequence:
        print("Triton launches in order (the first counted step), with the line that launched each:")
        for i, line in enumerate(sequence[: len(sequence) // steps]):
            print(f"    {i:4d} {line}")
    print("torch, by the code that issued them (a step):")
    for k, v in torch_ops.sites.most_common(40):
        print(f"    {k}: {v / steps:.0f}")


if __name__ == "__main__":
    main()
