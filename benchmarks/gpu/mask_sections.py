"""Structured-output sections of the slice benchmark (``v4_slice.py --sections mask engine_mask``): the
bitmask's share of a decode step, and whole engine steps with and without a JSON grammar."""

from __future__ import annotations

import os
import sys
import time

import torch
from bench_common import RESULTS, SMOKE, cuda_runtime, log, sync
from slice_model import build_slice


def section_mask(args) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import structured as sb  # benchmarks/structured.py

    from deepinfer_core.structured import StructuredOutputManager
    from deepinfer_cuda_sm100.ops.sampling import CudaSamplingOps

    dev = torch.device("cuda")
    tok = sb.v4_tokenizer()
    ops = CudaSamplingOps()
    step_ms = {
        r["batch"]: r.get("graph_ms")
        for r in RESULTS.get("slice", {}).get("decode", [])
        if r["context"] == 4096
    }
    out = []
    for name in ("xgrammar", "llguidance"):
        try:
            backend = sb.make_backend(name, tok)
        except Exception as e:  # noqa: BLE001
            out.append({"backend": name, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        for b in (1, 32, 128):
            manager = StructuredOutputManager({"b": lambda *a, _b=backend, **k: _b}, "b", tok, sb.V, [sb.EOS])
            ids = [f"r{i}" for i in range(b)]
            for rid in ids:
                manager.validate_and_compile(rid, sb.WORKLOADS["json schema"])
            logits = torch.randn(b, sb.V, device=dev)
            gen = torch.Generator().manual_seed(0)
            fills, applies = [], []
            for step in range(25):
                t0 = time.perf_counter()
                mask = manager.fill_bitmask(ids)
                t1 = time.perf_counter()
                ops.apply_bitmask(logits, mask.to(dev, non_blocking=True))
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                if step >= 5:
                    fills.append((t1 - t0) * 1e3)
                    applies.append((t2 - t1) * 1e3)
                for rid, t in zip(ids, sb.pick_tokens(mask, gen), strict=True):
                    if manager.accept(rid, [t]):
                        manager.free(rid)
                        manager.validate_and_compile(rid, sb.WORKLOADS["json schema"])
            fills.sort()
            applies.sort()
            row = {
                "backend": name,
                "batch": b,
                "fill_ms": fills[len(fills) // 2],
                "copy_apply_ms": applies[len(applies) // 2],
            }
            ref = step_ms.get(b)
            if ref:
                row["step_ms"] = ref
                row["pct_of_step"] = 100 * (row["fill_ms"] + row["copy_apply_ms"]) / ref
            log("mask", row)
            out.append(row)
    RESULTS["mask"] = out


def section_engine_mask(args) -> None:
    """Whole engine steps on the slice (tokenizer: DeepSeek-V4's, 129,280 tokens), 32 requests decoding:
    unconstrained vs JSON-constrained with each grammar backend. The step loop replays the decode graph
    (asynchronous) and then fills the bitmask on the host, so the fill overlaps the forward pass."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import structured as sb  # benchmarks/structured.py

    from deepinfer_core import SamplingParams, StructuredOutputsParams
    from deepinfer_core.config import load_config
    from deepinfer_core.engine.llm import LLM
    from deepinfer_core.engine.llm_engine import LLMEngine

    out = []
    tok = sb.v4_tokenizer()
    for backend in ("xgrammar", "llguidance"):
        config = load_config(
            environ={},
            backend="reference" if SMOKE else "cuda_sm100",
            structured_outputs_backend=backend,
            max_model_len=1024,
            max_num_seqs=args.engine_batch,
            kv_cache_memory_bytes=4 << 30,
        )
        if SMOKE:
            from deepinfer_core.runtime import build_runtime

            rt = build_runtime(config)
        else:
            rt = cuda_runtime(config)
        model = build_slice(args.layers, rt.backends, toy=SMOKE)
        engine = LLMEngine(config, model, rt.backends, tok, rt.registry.structured_backends)
        llm = LLM.from_engine(engine)
        steps: list[tuple[int, float]] = []
        execute = engine.runner.execute

        def counted(sched, steps=steps, execute=execute):
            steps.append((len(sched.scheduled), sched.num_tokens))
            return execute(sched)

        engine.runner.execute = counted
        step = engine.step

        def timed_step(step=step, steps=steps):
            t0 = time.perf_counter()
            r = step()
            sync()
            steps[-1] = (*steps[-1][:2], (time.perf_counter() - t0) * 1e3)
            return r

        engine.step = timed_step
        g = torch.Generator().manual_seed(0)
        prompts = [
            {"prompt_token_ids": torch.randint(2, 120000, (16,), generator=g).tolist()}
            for _ in range(args.engine_batch)
        ]
        row = {"backend": backend, "batch": args.engine_batch}
        for name, so in (
            ("free", None),
            ("json_schema", StructuredOutputsParams(json=sb.SCHEMA, disable_any_whitespace=True)),
            ("json_object", StructuredOutputsParams(json_object=True, disable_any_whitespace=True)),
        ):
            if name == "free" and backend != "xgrammar":
                continue
            for _ in range(2):  # the first pass captures the graphs
                steps.clear()
                params = [
                    SamplingParams(
                        temperature=1.0, seed=i, max_tokens=48, ignore_eos=so is None, structured_outputs=so
                    )
                    for i in range(args.engine_batch)
                ]
                outs = llm.generate(prompts, params, use_tqdm=False)
            full = sorted(ms for n, t, ms in steps if n == args.engine_batch and t == n)
            row[f"{name}_step_ms"] = full[len(full) // 2] if full else None
            row[f"{name}_full_steps"] = len(full)
            row[f"{name}_mean_tokens"] = sum(len(o.outputs[0].token_ids) for o in outs) / len(outs)
            if so is not None:
                row[f"{name}_finish_stop"] = sum(o.outputs[0].finish_reason == "stop" for o in outs)
        out.append(row)
        log("engine_mask", row)
        engine = llm = model = rt = None
        if not SMOKE:
            torch.cuda.empty_cache()
    free = out[0].get("free_step_ms")
    for row in out:
        for name in ("json_schema", "json_object"):
            if free and row.get(f"{name}_step_ms"):
                row[f"{name}_pct_over_free"] = 100 * (row[f"{name}_step_ms"] / free - 1)
    log("engine_mask", out)
    RESULTS["engine_mask"] = out
