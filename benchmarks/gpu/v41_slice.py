"""The V4.1-Flash-shaped slice on the GPU: plain decode against DSpark, through ``LLM.generate``'s engine.

V4.1-Flash's widths (hidden 5,120; 64 heads x 512; q LoRA 1,280; output LoRA 1,024 x 8 groups; indexer
32 x 128, top-512; 384 routed experts x 2,304, top-6, FP4; 3 DSpark stages of 128 experts, top-3, block 5;
vocabulary 129,280) on the demo checkpoint's 8-layer pattern of V4.1-Flash's layer kinds: an SWA layer with
the Engram lookup, ratio-2 Full, Reuse and Reindex layers, the ratio-1 Full layer that is the candidate source,
and ratio-1 decoder layers (Reuse, Reindex), the last three being DSpark's target layers. Random weights in
DeepSeek's stored formats (FP8 32 x 32 blocks with ue8m0 scales, FP4 experts) go through the real V4.1
checkpoint loader; the Engram table is a real file, memory-mapped, read on the host as the engine reads
V4.1's tables (4.2 M rows here, not Flash's 384 M: the rows a step reads are the same 24 per token).

Per batch (``--batches``), ``B`` prompts of ``--prompt`` random tokens and ``--tokens`` greedy tokens each
(EOS ignored), graphed (the CUDA default), once plain and once with DSpark at ``k`` drafts (``--ks``):

- ``step_ms``: the median wall time of the engine's steps in which all ``B`` sequences decode (plain: one
  token each; DSpark: one verified round);
- ``tokens_per_round``: output tokens per sequence per step (plain 1; DSpark 1 + accepted drafts, measured:
  DSpark's heads are random here, so almost nothing is accepted);
- ``tpot_ms``: time per output token, ``step_ms / tokens_per_round``, and, composed from the measured
  round time, at acceptance lengths of 2.0 (the trained demo's measured figure at k = 5), 2.8 and 3.5 (the
  range peers report for V4.1-Flash): the round time does not depend on how many drafts are accepted
  beyond the DSpark context step's rows (1 + accepted), which this omits;
- ``forward_ms``: the engine's captured decode graph of that batch replayed alone (forward pass and logits, no
  host work, no Engram read), and its share of the HBM roofline: the bytes a step must read (weights the batch
  touches and a KV model, ``decode_bytes``) over the copy rate measured at the start of the run;
- ``verify_ms`` / ``draft_ms``: DSpark's captured verify graph (``1 + k`` rows a sequence) and draft graphs
  replayed alone.

Run from the repository root (as the other GPU scripts; ``--smoke``: toy sizes on the CPU reference backend):

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100:plugins/deepinfer_spec_decode:plugins/deepinfer_structured \\
        python benchmarks/gpu/v41_slice.py [--batches 1 16 64] [--ks 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from bench_common import RESULTS, SMOKE, ceilings, cuda_runtime, log, sync, time_call
from engine_sections import _timed_steps
from graph_profile import host_profile_text, op_sites, profile_call, profile_graph, replay_ms
from slice_cost41 import decode_bytes, prefill_flops41, weight_bytes41
from slice_model41 import build_v41_slice, slice_prompts

# ----------------------------------------------------------------------------------------- the engine


def slice_llm(model, rt, args, **settings):
    """``LLM.generate`` over the built slice (its weights shared by every engine of the run): the CUDA platform
    (the reference backend with ``--smoke``), graphs, the run's KV budget, and ``settings``."""
    from cuda_settings import cuda_env

    from deepinfer_core.config import load_config
    from deepinfer_core.engine.llm import LLM
    from deepinfer_core.engine.llm_engine import LLMEngine

    config = load_config(
        environ={} if SMOKE else cuda_env(),
        backend="reference" if SMOKE else "cuda_sm100",
        kv_cache_memory_bytes=args.kv_bytes,
        enforce_eager=SMOKE or getattr(args, "eager", False),
        device_plan=bool(getattr(args, "device_plan", 1)),
        **settings,
    )
    reg = rt.registry
    return LLM.from_engine(
        LLMEngine(config, model, rt.backends, None, reg.structured_backends, reg.proposers)
    )


def release(rt) -> None:
    """After an engine is dropped: its memory back, and the next engine captures into a fresh graph pool (the
    engines share these memory ops; the old pool, its graphs freed, is released, and capturing into its stale
    handle fails an allocator assert)."""
    if not SMOKE:
        torch.cuda.empty_cache()
        rt.backends.memory._pool = None


def head_ms(model, rows: int) -> float:
    """The head alone (final norm and logits of ``rows`` rows: ``compute_logits``), captured in a graph and
    replayed (median of 20), as the decode graph runs it."""
    x = torch.randn(rows, model.cfg.hidden_size, dtype=model.dtype, device=model.head.value.device)
    if SMOKE:
        return time_call(lambda: model.compute_logits(x))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model.compute_logits(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.compute_logits(x)
    return time_call(graph.replay)


def prefill_section(args, model, rt, ceil) -> None:
    """One ``--prefill``-token prompt (a chunk) through ``LLM.generate`` (``max_tokens=1``: the prefill step and
    its first token), plain and with SWA bounded replay (the decoder layers on the chunk's last window), each
    the median of 3 distinct prompts after a warm-up one; FLOPs by :func:`prefill_flops41` over the BF16 matmul
    rate measured at the start of the run."""
    from deepinfer_core import SamplingParams

    n = args.prefill
    prompts = [{"prompt_token_ids": p} for p in slice_prompts(4, n, model.vocab_size)]
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    out = {"tokens": n}
    for replay in (False, True):
        llm = slice_llm(
            model,
            rt,
            args,
            max_model_len=n + 16,
            max_num_seqs=1,
            max_num_batched_tokens=n,
            enable_prefix_caching=False,
            swa_bounded_replay=replay,
        )
        llm.generate(prompts[:1], sp, use_tqdm=False)
        ts = []
        for p in prompts[1:]:
            sync()
            t0 = time.perf_counter()
            llm.generate([p], sp, use_tqdm=False)
            sync()
            ts.append((time.perf_counter() - t0) * 1e3)
        ms = sorted(ts)[len(ts) // 2]
        if args.profile_prefill and not replay and not SMOKE:
            out["profile"] = profile_call(lambda g=llm.generate: g(prompts[1:2], sp, use_tqdm=False))
        fl = prefill_flops41(model, n, model.cfg.sliding_window if replay else None)
        row = {"ms": ms, "all_ms": ts, **fl, "tflops": fl["flops"] / ms / 1e9}
        if ceil:
            row["matmul_share"] = fl["flops"] / (ms * 1e-3) / ceil["bf16_matmul_flops"]
        out["bounded_replay" if replay else "plain"] = row
        log("v41 prefill", "bounded replay" if replay else "plain", row)
        RESULTS["prefill"] = out
        save(args.out)
        llm = None
        release(rt)


def section_engine(args, model, rt, ceil) -> None:
    from deepinfer_core import SamplingParams

    wb = weight_bytes41(model)
    prompts = [
        {"prompt_token_ids": p}
        for p in slice_prompts(max(args.batches), args.prompt, model.vocab_size, args.shared_prefix)
    ]
    ctx = args.prompt + args.tokens
    rows, tokens = {}, {}
    ks = [k for k in args.ks if k]  # --ks 0: plain decode only
    for k in [0, *ks]:
        spec = {"method": "dspark", "num_speculative_tokens": k} if k else None
        llm = slice_llm(
            model,
            rt,
            args,
            max_model_len=ctx + 16,
            max_num_seqs=max(args.batches),
            max_num_batched_tokens=8192,
            speculative_config=spec,
        )
        engine = llm.engine
        steps = _timed_steps(engine)
        tag = f"dspark_k{k}" if k else "plain"
        for b in args.batches:
            sp = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
            # captures this batch's graphs; the second run compiles the prefix-cache-hit shapes
            for _ in range(2):
                llm.generate(prompts[:b], sp, use_tqdm=False)
            before = dict(engine.spec_stats.as_dict()) if k else {}
            steps.clear()
            prof = cProfile.Profile() if b == args.host_profile else None
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            outs = llm.generate(prompts[:b], sp, use_tqdm=False)
            sync()
            wall = time.perf_counter() - t0
            if prof:
                prof.disable()
                RESULTS.setdefault("host_profile", {})[f"{tag} {b}"] = host_profile_text(prof)
            full = sorted(ms for n, _, ms in steps if n == b)
            step_ms = full[len(full) // 2] if full else float("nan")
            n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
            row = rows.setdefault(b, {"batch": b})
            if k:
                st = engine.spec_stats.as_dict()
                rounds = len(full)
                per_round = n_tok / b / max(rounds, 1) or float("nan")
                row[tag] = {
                    "round_ms": step_ms,
                    "rounds": rounds,
                    "tokens_per_round": per_round,
                    "tpot_ms": step_ms / per_round,
                    "tpot_ms_at_length": {str(L): step_ms / L for L in (2.0, 2.8, 3.5)},
                    "acceptance_per_position": st["spec_acceptance_per_position"],
                    "accepted": st["spec_num_accepted_tokens"] - before.get("spec_num_accepted_tokens", 0),
                    "generate_tok_s": n_tok / wall,
                }
            else:
                row[tag] = {"step_ms": step_ms, "tpot_ms": step_ms, "generate_tok_s": n_tok / wall}
            tokens[(k, b)] = [o.outputs[0].token_ids for o in outs]
            if not k and args.save_tokens:
                RESULTS.setdefault("tokens", {})[str(b)] = tokens[(k, b)]
            log("v41 engine", tag, b, row[tag])
            RESULTS["engine_rows"] = list(rows.values())  # kept if a later part fails
            save(args.out)  # and written now: a device call cut at its time limit still returns them
        runner = engine.runner
        if k == 0 and args.profile:
            RESULTS["profile"] = profile_graph(runner, args.profile)
        if k == 0 and args.op_sites:
            try:  # a diagnosis: the timings after it still run if it fails
                RESULTS["op_sites"] = op_sites(runner, args.op_sites)
            except Exception:
                log("op_sites failed:", traceback.format_exc())
        if k == 0:
            graphs = replay_ms(runner, lambda key: key and key[0] != "draft" and key[-1] == 1)
            for b in args.batches:
                key = runner.graph_key(b, ctx - 1)
                if key is not None and str(key) in graphs:
                    rows[b]["layers"] = {"graph_key": str(key), "graph_ms": graphs[str(key)]}
                    rows[b]["layers"]["head_ms"] = head_ms(model, key[0])
        else:
            graphs = replay_ms(runner, lambda key: True)
        for key, ms in graphs.items():
            log("v41 graph", tag, key, f"{ms:.3f} ms")
        RESULTS.setdefault("graphs", {})[tag] = graphs
        save(args.out)
        engine = llm = runner = None
        release(rt)
    copy = ceil["copy_bytes_per_s"] if ceil else float("nan")
    for b, row in rows.items():
        row["roofline_bytes"] = decode_bytes(model, wb, b, ctx)
        row["roofline_ms"] = row["roofline_bytes"] / copy * 1e3
        if "layers" in row:  # the per-layer share: the graph without the head, against the layers' bytes
            lay = row["layers"]
            lay["bytes"] = row["roofline_bytes"] - wb["head"] - b * wb["embed_row"]
            lay["ms"] = lay["graph_ms"] - lay["head_ms"]
            lay["share"] = lay["bytes"] / copy * 1e3 / lay["ms"]
            lay["ms_per_layer"] = lay["ms"] / model.cfg.num_hidden_layers
            lay["head_share"] = (wb["head"] + b * wb["embed_row"]) / copy * 1e3 / lay["head_ms"]
        for k in ks:
            row[f"dspark_k{k}"]["greedy_equal_plain"] = tokens[(k, b)] == tokens[(0, b)]
    RESULTS["engine"] = {
        "prompt": args.prompt,
        "shared_prefix": args.shared_prefix,
        "tokens": args.tokens,
        "rows": list(rows.values()),
        "bytes": wb,
    }
    log("v41 engine", RESULTS["engine"])


def save(out: str) -> None:
    with open(os.path.join(out, "v41_slice.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def main() -> None:
    from cuda_settings import cuda_env

    from deepinfer_core.config import load_config
    from deepinfer_core.runtime import build_runtime

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 16, 64])
    ap.add_argument(
        "--ks", type=int, nargs="+", default=[5], help="DSpark drafts a round (0: plain decode only)"
    )
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="the prompts share their first N tokens (prefilled once through the prefix cache; decode still "
        "reads each sequence's own blocks, which hold the same entries)",
    )
    ap.add_argument("--prefill", type=int, default=0, help="time a prefill of N tokens (0: not measured)")
    ap.add_argument("--profile-prefill", action="store_true", help="GPU time per kernel of one plain prefill")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--kv-bytes", type=int, default=16 << 30)
    ap.add_argument("--profile", type=int, default=0, help="profile the plain decode graph of this batch")
    ap.add_argument(
        "--op-sites",
        type=int,
        default=0,
        help="the torch operators of this batch's plain decode graph, by caller",
    )
    ap.add_argument(
        "--host-profile", type=int, default=0, help="cProfile the timed generate of this batch (host time)"
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--engram-in-step",
        default="auto",
        choices=["auto", "on", "off"],
        help="EngineConfig.engram_in_step: the device reads the Engram tables in place (auto: if they fit)",
    )
    ap.add_argument(
        "--save-tokens", action="store_true", help="keep plain decode's greedy tokens in the JSON"
    )
    ap.add_argument(
        "--float32", action="store_true", help="activations and unquantized weights in float32 (default bf16)"
    )
    ap.add_argument(
        "--activation-quant",
        default="none",
        choices=["none", "fp8"],
        help="EngineConfig.activation_quant: fp8 quantises every FP8 / FP4 GEMM input as DeepSeek's release does",
    )
    ap.add_argument(
        "--device-plan",
        type=int,
        nargs="?",
        const=1,
        default=1,
        help="EngineConfig.device_plan: static plans built inside the decode graphs (the default, 1, where the "
        "Engram tables are read in the step; 0: the host's plan)",
    )
    ap.add_argument(
        "--eager",
        action="store_true",
        help="EngineConfig.enforce_eager: no decode graphs (the layers' graph timings are then absent); the slice "
        "fixes it, so DEEPINFER_ENFORCE_EAGER does not reach it",
    )
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU reference backend")
    args = ap.parse_args()
    if SMOKE:
        args.kv_bytes = min(args.kv_bytes, 256 << 20)
    os.makedirs(args.out, exist_ok=True)
    RESULTS["meta"] = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "argv": sys.argv,
        "torch": torch.__version__,
    }
    backend = "reference" if SMOKE else "cuda_sm100"
    # the DEEPINFER_CUDA_SM100__* A/B switches reach the kernels through the runtime's platform (its finalize
    # makes them the active settings); an engine config given to LLMEngine later does not re-apply them
    config = load_config(environ={} if SMOKE else cuda_env(), backend=backend)
    rt = build_runtime(config) if SMOKE else cuda_runtime(config)
    RESULTS["meta"]["cuda_sm100"] = dict(config.sections.get("cuda_sm100", {}))
    dev = rt.backends.memory.device
    ceil = {} if SMOKE else ceilings(dev)
    RESULTS["ceilings"] = ceil
    dtype = torch.float32 if SMOKE or args.float32 else torch.bfloat16
    with tempfile.TemporaryDirectory(prefix="v41slice_") as tmp:
        try:
            in_step = {"auto": None, "off": False, "on": True}[args.engram_in_step]
            model = build_v41_slice(rt.backends, dtype, SMOKE, Path(tmp), in_step)
            model.use_activation_quant(args.activation_quant)
            RESULTS["build"] = {
                "dtype": str(dtype),
                "activation_quant": args.activation_quant,
                "engram_in_step": model.engram_in_step,
                "layers": model.cfg.num_hidden_layers,
                "roles": [str(r) for r in model.cfg.roles],
                "routed_experts": model.cfg.n_routed_experts,
            }
            if not SMOKE:
                RESULTS["build"]["gpu_bytes_allocated"] = torch.cuda.memory_allocated()
            if (
                args.prefill
            ):  # first: a DSpark engine turns the model's stages on, which bounded replay refuses
                prefill_section(args, model, rt, ceil)
            if args.batches:
                section_engine(args, model, rt, ceil)
        except Exception:  # noqa: BLE001 - keep what was measured
            log(traceback.format_exc()[-3000:])
            RESULTS["error"] = traceback.format_exc()[-1500:]
        save(args.out)


if __name__ == "__main__":
    main()
