"""End-to-end checks and the V4-Flash-shaped slice benchmark for ``cuda_sm100``, in one run on one GPU.

Run from the repository root (the plugins are passed to the runtime directly, no install needed):

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100:plugins/deepinfer_structured:tests/.. \\
        python benchmarks/gpu/v4_slice.py [--sections greedy slice peer mask] [--layers 4] [--out DIR]

Sections (each runs on its own; a failure is printed and the next one runs):

- ``greedy``: tiny random-weight V4 checkpoints (the test suite's oracle schedules, written by transformers)
  generated greedily by the reference backend on the CPU in float32 and by ``cuda_sm100`` in float32
  (eager and with CUDA graphs) and bfloat16, all prompts in one batch. float32 must give the same tokens;
  bfloat16 reports the token agreement and the largest logprob difference. Also checks that a replayed
  decode step makes no host synchronisation (``torch.cuda.set_sync_debug_mode("error")``).
- ``slice``: V4-Flash's dimensions with ``--layers`` layers (sliding, CSA, HCA, CSA, ...), random weights in
  DeepSeek's formats (FP8 e4m3 128x128 for attention and shared experts, FP4 e2m1 routed experts, BF16
  embedding and head) loaded through the real checkpoint loader. Decode steps (forward + logits, graphs
  and eager) at batch 1/16/64/256 and context 4k/32k over KV pools laid out as the engine lays them out;
  prefill of one 8k prompt. Bytes and FLOPs per step come from a stated model (below); the ceilings, copy
  bandwidth and BF16 matmul rate, are measured at the start of the same run.
- ``peer``: the same slice in transformers' ``DeepseekV4ForCausalLM`` (BF16 weights), decode at context
  4k for the same batches (cache prefilled for one prompt, then replicated per row).
- ``mask``: structured-output mask time per decode step (xgrammar / llguidance fill on this host, copy,
  and the plugin's bitmask kernel) at batch 1/32/128 over the 129,280-token vocabulary, as a share of the
  slice's measured decode step at context 4k.

The slice itself (config, random DeepSeek-format weights, byte/FLOP model, hand-built decode batches)
is ``slice_model.py``. Byte model of a decode step (what must cross HBM at least once): every non-routed-expert weight, the
head,
the routed experts a uniform router touches in expectation (``E * (1 - (1 - k/E)^B)`` per layer), the
``B`` embedding rows, and per row the KV it reads: the 128-token window, on CSA layers the indexer keys of
every compressed entry plus the 512 selected entries, on HCA layers every compressed entry.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback

import torch
from bench_common import RESULTS, SMOKE, ceilings, cuda_runtime, log, make_llm, profile_step, sync, time_call
from cuda_settings import cuda_env
from engine_sections import section_engine  # noqa: F401 - a section, called by name
from mask_sections import section_engine_mask, section_mask  # noqa: F401 - sections, called by name
from slice_model import (
    FLASH,
    RATIOS,
    TOY,
    SliceRunner,
    build_slice,
    decode_bytes,
    prefill_flops,
    weight_bytes,
)

# ----------------------------------------------------------------------------------------- greedy


def section_greedy(args) -> None:
    import random
    import tempfile

    from deepinfer_core import SamplingParams
    from tests.models.deepseek_v4.tiny import CSA, HCA, SWA, Schedule, build_hf

    schedules = [
        Schedule("csa_hca", (CSA, HCA)),
        Schedule("swa_csa_hca_hc4", (SWA, CSA, HCA), hc_mult=4, extra={"index_topk": 8}),
    ]
    out = {}
    for sch in schedules:
        path = tempfile.mkdtemp(prefix=f"v4_{sch.name}_")
        build_hf(sch, seed=1).save_pretrained(path)
        rng = random.Random(5)
        vocab = 320
        prompts = [
            {"prompt_token_ids": [rng.randrange(2, vocab) for _ in range(n)]}
            for n in (1, 7, 33, 130, 300, 64)
        ]
        sp = SamplingParams(max_tokens=24, temperature=0.0, logprobs=1, ignore_eos=True)
        kw = dict(max_model_len=512, kv_cache_memory_bytes=256 << 20, max_num_batched_tokens=256)
        refs = {
            kv: make_llm(path, "reference", dtype="float32", kv_cache_dtype=kv, **kw).generate(
                prompts, sp, use_tqdm=False
            )
            for kv in ("auto", "fp8")
        }
        row = {}
        for name, extra in (
            ("cuda_f32_eager", dict(dtype="float32", enforce_eager=True)),
            ("cuda_f32_graphs", dict(dtype="float32")),
            ("cuda_f32_graphs_device_plan", dict(dtype="float32", device_plan=True)),
            ("cuda_bf16_graphs", dict(dtype="bfloat16")),
            (
                "cuda_f32_graphs_fp8kv",
                dict(dtype="float32", kv_cache_dtype="fp8"),
            ),  # vs the reference's fp8 KV
        ):
            llm = make_llm(path, "reference" if SMOKE else "cuda_sm100", **kw, **extra)
            got = llm.generate(prompts, sp, use_tqdm=False)
            ref = refs[extra.get("kv_cache_dtype", "auto")]
            same = total = 0
            lp_diff = 0.0
            for r, g in zip(ref, got, strict=True):
                rt, gt = r.outputs[0].token_ids, g.outputs[0].token_ids
                total += len(rt)
                for j, (a, b) in enumerate(zip(rt, gt, strict=True)):
                    if a != b:
                        break
                    same += 1
                    lp_diff = max(
                        lp_diff,
                        abs(r.outputs[0].logprobs[j][a].logprob - g.outputs[0].logprobs[j][b].logprob),
                    )
            row[name] = {
                "tokens_equal_prefix": f"{same}/{total}",
                "all_equal": same == total,
                "max_logprob_diff_on_equal_prefix": lp_diff,
                "graphs_captured": sorted(map(list, llm.engine.runner.graphs)),
            }
            log(sch.name, name, row[name])
            if name.startswith("cuda_f32_graphs") and not SMOKE:
                row["sync_free_replay"] = sync_check(llm, prompts[0])
                log(sch.name, "sync_free_replay", row["sync_free_replay"])
        out[sch.name] = row
    RESULTS["greedy"] = out


def sync_check(llm, prompt) -> str:
    """Run one more request; on a replayed decode step, make every host synchronisation an error."""
    from deepinfer_core import SamplingParams

    runner = llm.engine.runner
    run = runner.run
    seen = {"replayed": 0}

    def checked(batch):
        if batch.graph_key is not None and batch.graph_key in runner.graphs:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = run(batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            seen["replayed"] += 1
            return out
        return run(batch)

    runner.run = checked
    try:
        llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    except RuntimeError as e:
        return f"FAILED: {e}"
    finally:
        runner.run = run
    return f"ok: {seen['replayed']} replayed steps without a host synchronisation"


# ----------------------------------------------------------------------------------------- the slice


def section_slice(args) -> None:
    from deepinfer_core.config import load_config
    from deepinfer_core.runtime import build_runtime

    if SMOKE:
        dev = torch.device("cpu")
        ceil = RESULTS.setdefault("ceilings", {"copy_bytes_per_s": 1e10, "bf16_matmul_flops": 1e11})
        rt = build_runtime(load_config(environ={}, backend="reference"))
    else:
        dev = torch.device("cuda")
        ceil = RESULTS.setdefault("ceilings", ceilings(dev))
        rt = cuda_runtime(load_config(environ=cuda_env(), backend="cuda_sm100"))
    log("ceilings", ceil)
    t0 = time.perf_counter()
    model = build_slice(args.layers, rt.backends, toy=SMOKE)
    sync()
    wb = weight_bytes(model)
    log(f"slice built in {time.perf_counter() - t0:.1f} s", wb)
    cfg = model.cfg
    out = {
        "layers": args.layers,
        "compress_ratios": cfg.compress_ratios[: cfg.num_hidden_layers],
        "decode": [],
    }
    if args.fp4_tiles:
        from gemm_tiles import force_fp4_tiles

        out["fp4_tiles"] = force_fp4_tiles(args.fp4_tiles)
        log("FP4 expert tiles forced:", out["fp4_tiles"])
    if args.prefill_tiles:
        from gemm_tiles import force_prefill_tiles

        out["prefill_tiles"] = force_prefill_tiles(args.prefill_tiles)
        log("prefill tiles forced:", out["prefill_tiles"])
    max_b, max_ctx = max(args.batches), max(args.contexts)
    model.use_kv_cache_dtype(args.kv_cache_dtype)
    fmt = model.layers[0].attn.kv_format
    entry = fmt.row_bytes if fmt is not None else None
    out["kv_cache_dtype"] = args.kv_cache_dtype
    sr = SliceRunner(model, rt.backends, max_b, max_ctx, graphs=True, prefill=args.prefill)
    log(f"KV pools {sum(t.numel() * t.element_size() for t in sr.runner.kv.values()) / 1e9:.1f} GB")
    for ctx in args.contexts:
        for b in args.batches:
            row = {"batch": b, "context": ctx}
            for mode in ("graph", "eager"):
                if mode == "eager" and b > 64:
                    continue
                try:
                    fb = sr.batch(b, ctx, graph=mode == "graph").to(dev)
                    if mode == "eager":
                        fb.graph_key = None
                    ms = time_call(lambda fb=fb: sr.runner.run(fb), reps=10 if b >= 64 else 20)
                    row[f"{mode}_ms"] = ms
                except Exception as e:  # noqa: BLE001 - report and go on
                    row[f"{mode}_error"] = f"{type(e).__name__}: {e}"[:300]
                    log(traceback.format_exc()[-2000:])
            byts = decode_bytes(cfg, wb, b, ctx, entry)
            row["bytes"] = byts
            row["roofline_ms"] = byts / ceil["copy_bytes_per_s"] * 1e3
            if "graph_ms" in row:
                row["pct_roofline"] = 100 * row["roofline_ms"] / row["graph_ms"]
                row["tok_per_s"] = b / row["graph_ms"] * 1e3
            log(row)
            out["decode"].append(row)
    if args.profile:
        out["profile"] = {b: profile_step(sr, b, args.contexts[0], dev) for b in args.profile}
    tokens = args.prefill
    if tokens:  # --prefill 0: not measured
        try:
            fb = sr.prefill_batch(tokens).to(dev)
            ms = time_call(lambda: sr.runner.run(fb), reps=3)
            fl = prefill_flops(cfg, tokens)
            out["prefill"] = {
                "tokens": tokens,
                "ms": ms,
                "flops": fl,
                "tflops": fl / ms / 1e9,
                "pct_matmul": 100 * fl / (ms * 1e-3) / ceil["bf16_matmul_flops"],
                "tok_per_s": tokens / ms * 1e3,
            }
            log("prefill", out["prefill"])
            if args.profile_prefill and not SMOKE:
                from graph_profile import profile_call

                out["prefill"]["profile"] = profile_call(lambda: sr.runner.run(fb))
        except Exception as e:  # noqa: BLE001
            out["prefill_error"] = f"{type(e).__name__}: {e}"[:300]
            log(traceback.format_exc()[-2000:])
    RESULTS["slice"] = out
    sr = model = None
    if not SMOKE:
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------- peer


def section_peer(args) -> None:
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    dev = torch.device("cpu" if SMOKE else "cuda")
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    n = args.layers
    f = {**FLASH, **(TOY if SMOKE else {})}
    cfg = DeepseekV4Config(
        vocab_size=f["vocab_size"],
        hidden_size=f["hidden_size"],
        moe_intermediate_size=f["moe_intermediate_size"],
        num_hidden_layers=n,
        num_attention_heads=f["num_attention_heads"],
        head_dim=f["head_dim"],
        q_lora_rank=f["q_lora_rank"],
        qk_rope_head_dim=f["qk_rope_head_dim"],
        num_experts_per_tok=f["num_experts_per_tok"],
        n_routed_experts=f["n_routed_experts"],
        layer_types=[kinds[r] for r in RATIOS[:n]],
        hc_mult=f["hc_mult"],
        compress_rates={kinds[4]: 4, kinds[128]: 128},
        mlp_layer_types=["hash_moe"] * 2 + ["moe"] * (n - 2),
        sliding_window=f["sliding_window"],
        o_groups=f["o_groups"],
        o_lora_rank=f["o_lora_rank"],
        index_n_heads=f["index_n_heads"],
        index_head_dim=f["index_head_dim"],
        index_topk=f["index_topk"],
        max_position_embeddings=f["max_position_embeddings"],
    )
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = DeepseekV4ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    log(f"transformers slice: {params / 1e9:.1f}B parameters")
    out = {"params": params, "decode": []}
    ctx = 4096 if not SMOKE else 300
    with torch.no_grad():
        ids = torch.randint(2, cfg.vocab_size, (1, ctx - 1), device=dev)
        pre = model(input_ids=ids, use_cache=True)
        base = pre.past_key_values
        for b in args.batches:
            row = {"batch": b, "context": ctx}
            try:
                import copy

                cache = copy.deepcopy(base)
                cache.reorder_cache(torch.zeros(b, dtype=torch.long, device=dev))
                tok = torch.randint(2, cfg.vocab_size, (b, 1), device=dev)

                def step(tok=tok, cache=cache):
                    model(input_ids=tok, past_key_values=cache, use_cache=True)

                # each call appends one position; 13 calls move the context by 13 tokens (0.3%)
                row["ms"] = time_call(step, reps=10)
                row["tok_per_s"] = b / row["ms"] * 1e3
                cache = None
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                log(traceback.format_exc()[-2000:])
            if not SMOKE:
                torch.cuda.empty_cache()
            log("peer", row)
            out["decode"].append(row)
    RESULTS["peer"] = out
    model = None
    if not SMOKE:
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", nargs="+", default=["greedy", "slice", "mask", "peer"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32, 64, 128, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "fp8"], help="attention KV pools (slice)"
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--engine-batch", type=int, default=32)
    ap.add_argument("--engine-prompt", type=int, default=64, help="engine section: prompt tokens")
    ap.add_argument(
        "--engine-tokens", type=int, default=128, help="engine section: sampled tokens per request"
    )
    ap.add_argument("--engine-kv-bytes", type=int, default=16 << 30, help="engine section: KV budget")
    ap.add_argument(
        "--engine-max-seqs", type=int, default=0, help="engine section: max_num_seqs (0: the largest batch)"
    )
    ap.add_argument(
        "--engine-host-profile",
        action="store_true",
        help="engine section: cProfile + CUDA API counts at the first batch",
    )
    ap.add_argument(
        "--device-plan",
        type=int,
        nargs="?",
        const=1,
        default=1,
        help="engine section: the engine's device_plan setting (slot plans built inside the decode graphs; the "
        "default, 1; 0: the host's plan)",
    )
    ap.add_argument("--profile", type=int, nargs="*", default=[], help="batches to profile per kernel")
    ap.add_argument("--profile-prefill", action="store_true", help="GPU time per kernel of one prefill")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (slice section only)")
    ap.add_argument("--fp4-tiles", default="", help="bm,bn,bk,warps,stages or best:gemm_kernels.json")
    ap.add_argument(
        "--prefill-tiles", default="", help="mixes:old and/or attn:bh,bn,warps,stages (';' between)"
    )
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    RESULTS["meta"] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (smoke)",
        "torch": torch.__version__,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "argv": sys.argv,
    }
    log(RESULTS["meta"])
    for s in args.sections:
        t0 = time.perf_counter()
        try:
            globals()[f"section_{s}"](args)
        except Exception:  # noqa: BLE001 - one section's failure must not hide the others
            log(f"section {s} failed:\n{traceback.format_exc()[-3000:]}")
            RESULTS.setdefault("errors", {})[s] = traceback.format_exc()[-1500:]
        log(f"section {s}: {time.perf_counter() - t0:.1f} s")
        with open(os.path.join(args.out, "v4_slice.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


if __name__ == "__main__":
    main()
