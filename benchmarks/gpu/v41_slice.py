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
import io
import json
import math
import os
import pstats
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

import torch
from bench_common import RESULTS, SMOKE, ceilings, cuda_runtime, log, sync
from engine_sections import _timed_steps
from slice_model import weight_bytes

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "deepinfer_core" / "demo_model_v41" / "config.json"

FLASH41 = dict(
    vocab_size=129280,
    hidden_size=5120,
    num_attention_heads=64,
    head_dim=512,
    qk_rope_head_dim=64,
    q_lora_rank=1280,
    o_groups=8,
    o_lora_rank=1024,
    sliding_window=128,
    index_n_heads=32,
    index_head_dim=128,
    index_topk=512,
    candidate_topk_blocks=2048,
    candidate_block_size=8,
    n_routed_experts=384,
    num_experts_per_tok=6,
    moe_intermediate_size=2304,
    engram_head_dim=256,
    engram_n_heads=8,
    engram_max_ngram_size=4,
    engram_compressed_vocab_size=99092,
    engram_vocab_size=174763,  # 24 primes above it: 4.19 M rows, 1.1 GB with scales
    dspark_markov_rank=256,
    dspark_n_routed_experts=128,
    dspark_n_activated_experts=3,
    dspark_noise_token_id=128799,
    max_position_embeddings=65536,
    rope_scaling={
        "type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
)
#: ``--smoke``: the demo's widths (the demo checkpoint's own config) with a small Engram table
TOY41 = dict(engram_vocab_size=1009, engram_compressed_vocab_size=4997)
ENGRAM_LAYERS = [0]  # the issue asks for one Engram layer (V4.1-Flash has two, at layers 1 and 14)


def slice_config(toy: bool) -> dict:
    """``config.json`` of the slice: the demo's layer pattern, V4.1-Flash's widths (``toy``: the demo's)."""
    from deepinfer_core.models.deepseek_v41.config import EngramConfig
    from deepinfer_core.models.deepseek_v41.engram import bucket_primes

    raw = json.loads(DEMO_CONFIG.read_text())
    text = {**raw["text_config"], **(TOY41 if toy else FLASH41), "engram_layer_ids": ENGRAM_LAYERS}
    e = EngramConfig(
        tuple(ENGRAM_LAYERS), (), text["engram_max_ngram_size"], text["engram_vocab_size"],
        text["engram_n_heads"], text["engram_head_dim"], text["engram_pad_id"],
        text["engram_compressed_vocab_size"],
    )  # fmt: skip
    # a table's rows are the sum of its bucket primes
    text["engram_num_embeddings"] = [sum(p for per_n in layer for p in per_n) for layer in bucket_primes(e)]
    return {**raw, "text_config": text}


class RandomReader41:
    """A checkpoint reader over random tensors in V4.1's stored formats, made on ``device`` on demand; Engram
    tables come from the real file ``path / ENGRAM_FILE`` (memory-mapped by the loader)."""

    ENGRAM_FILE = "engram.safetensors"

    def __init__(self, model, path: Path, device):
        from deepinfer_core.models.deepseek_v41.weights import StoredSlot

        self.path, self.device = Path(path), device
        self.meta: dict[str, tuple[str, tuple[int, ...], str, int]] = {}
        for name, s in model.named_slots():
            if not isinstance(s, StoredSlot):
                continue
            shape, scale = s.expected()
            if s.stored == "fp8":
                self.meta[name] = ("F8_E4M3", shape, "fp8", s.shape[1])
            elif s.stored == "fp4":
                self.meta[name] = ("U8", shape, "fp4", s.shape[1])
            elif s.stored == "rows8":
                self.meta[name] = ("F8_E4M3", shape, "engram", 0)
            else:
                self.meta[name] = ("F32" if s.stored == "f32" else "BF16", shape, s.stored, 0)
            if scale is not None:
                base = name[: -len("weight")]
                self.meta[base + "scale"] = ("F8_E8M0", scale, s.stored + "_scale", s.shape[1])

    def keys(self):
        return list(self.meta)

    def file_of(self, key):
        return self.ENGRAM_FILE if self.meta[key][2].startswith("engram") or key.endswith("engram.embed.scale") \
            else "random.safetensors"  # fmt: skip

    def info(self, key):
        dt, shape, _, _ = self.meta[key]
        return dt, shape

    def close(self):
        pass

    def get(self, key) -> torch.Tensor:
        """Tensor ``key``, from a generator seeded by its name: the same values whoever asks and in whatever
        order (DeepSeek's reference reads them too: ``v41_reference_peer.py``)."""
        dt, shape, kind, fan_in = self.meta[key]
        d = self.device
        g = torch.Generator(d).manual_seed(zlib.crc32(key.encode()))
        if kind == "fp8":  # codes ~ N(0, 1): weights of std ``scale``
            return torch.randn(shape, device=d, generator=g).to(torch.float8_e4m3fn)
        if kind == "fp8_scale":
            return torch.full(shape, 2.0 ** round(math.log2(fan_in**-0.5)), device=d).to(torch.float8_e8m0fnu)
        if kind == "fp4":
            return torch.randint(0, 256, shape, device=d, generator=g, dtype=torch.uint8)
        if kind == "fp4_scale":  # random e2m1 codes have an RMS of 2.9
            e = round(math.log2(fan_in**-0.5 / 2.9))
            return torch.full(shape, 2.0**e, device=d).to(torch.float8_e8m0fnu)
        t = torch.randn(shape, device=d, generator=g)
        leaf = key.rsplit(".", 1)[-1]
        if len(shape) == 1 and ("norm" in key or leaf in ("scale", "bias") or key.endswith("_scale")):
            return torch.ones(shape, device=d) if leaf != "bias" else torch.zeros(shape, device=d)
        if len(shape) >= 2 and dt == "F32":
            return t * 0.05
        if dt == "BF16" and len(shape) >= 2:
            return (t * shape[-1] ** -0.5).to(torch.bfloat16)
        return t * 0.1


def write_engram_file(reader: RandomReader41) -> int:
    """The Engram tables of the slice, random FP8 rows with ue8m0 scales, as a real safetensors file."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    tensors = {}
    for key, (_, shape, kind, _) in reader.meta.items():
        if kind != "engram":
            continue
        codes = torch.empty(shape, dtype=torch.float8_e4m3fn)
        step = 1 << 18
        for r in range(0, shape[0], step):  # in slabs: float32 of the whole table would be 4x its bytes
            codes[r : r + step] = torch.randn((min(step, shape[0] - r), shape[1]), generator=g).to(
                codes.dtype
            )
        scale_key = key[: -len("weight")] + "scale"
        s_shape = reader.meta[scale_key][1]
        tensors[key] = codes
        tensors[scale_key] = torch.full(s_shape, 2.0**-4).to(torch.float8_e8m0fnu)
    save_file(tensors, str(reader.path / reader.ENGRAM_FILE))
    return sum(t.numel() * t.element_size() for t in tensors.values())


ENGRAM_IN_STEP = ["auto"]  # --engram-in-step


def build_v41_slice(backends, dtype, toy: bool, workdir: Path):
    """The slice model with DSpark stages, loaded through the V4.1 loader from :class:`RandomReader41`."""
    from deepinfer_core.models.deepseek_v41.engram import (
        EngramHasher,
        bucket_primes,
        multipliers,
    )
    from deepinfer_core.models.deepseek_v41.model import DeepseekV41ForCausalLM, read_config
    from deepinfer_core.models.deepseek_v41.weights import load_weights
    from deepinfer_core.models.weight_checks import LoadOptions

    (workdir / "config.json").write_text(json.dumps(slice_config(toy), indent=1))
    cfg = read_config(workdir)
    model = DeepseekV41ForCausalLM(cfg, backends, dtype, True)
    device = backends.memory.device
    reader = RandomReader41(model, workdir, device)
    table_bytes = write_engram_file(reader)
    e = cfg.engram
    # no tokenizer.json: token ids map onto the compressed vocabulary by residue
    primes = bucket_primes(e)
    sizes = [[p for per_n in layer for p in per_n] for layer in primes]
    offsets = torch.tensor([[sum(s[:i]) for i in range(len(s))] for s in sizes], dtype=torch.int64)
    token_map = torch.arange(cfg.vocab_size, dtype=torch.int64) % e.compressed_vocab_size
    model.hasher = EngramHasher(
        token_map, int(token_map[e.pad_id]), torch.tensor(primes), offsets, multipliers(e)
    ).to(device)
    t0 = time.perf_counter()
    model.loaded = load_weights(model, reader, dtype, device, LoadOptions(check_weights_finite=False))
    sync()
    model.use_kv_cache_dtype("auto")
    t1 = time.perf_counter()
    placed = model.place_engram({"auto": None, "off": False, "on": True}[ENGRAM_IN_STEP[0]])
    log(f"Engram tables read in the step: {placed} (placed in {time.perf_counter() - t1:.1f} s)")
    log(f"slice built in {time.perf_counter() - t0:.1f} s; Engram table file {table_bytes / 1e9:.2f} GB")
    return model


# ----------------------------------------------------------------------------------------- bytes


def weight_bytes41(model) -> dict[str, float]:
    """Bytes a decode step reads (``slice_model.weight_bytes``): routed experts (per expert per layer), the rest of
    the target (DSpark's ``mtp.*`` stages and the host-resident Engram tables left out), one embedding row."""
    return weight_bytes(model, skip=lambda name: name.startswith("mtp.") or ".engram.embed." in name)


def kv_bytes_per_row(model, ctx: int) -> float:
    """A model of the KV bytes one decode row reads at context ``ctx``: every layer's window (FP8 entries), the
    top-k compressed entries (FP4) of compressed layers, and the index keys (FP4) an index source scores (all
    compressed positions before the candidate source, the candidate pool after it)."""
    c = model.cfg
    window = c.head_dim + 2 * c.qk_rope_head_dim + c.head_dim // 32 * 4  # e4m3 + bf16 rope + scales (about)
    entry = c.head_dim // 2 + c.head_dim // 16  # e2m1 + e4m3 scale per 16
    key = c.index_head_dim // 2 + c.index_head_dim // 16
    pool = c.candidate_topk_blocks * c.candidate_block_size
    total = 0.0
    for i, role in enumerate(model.cfg.roles):
        total += min(ctx, c.sliding_window) * window
        if role.ratio:
            n = ctx // role.ratio
            total += min(c.index_topk, n) * entry
            if i in c.index_source_layers:
                total += (n if i <= c.candidate_source_layer else min(n, pool)) * key
    return total


def decode_bytes(model, wb, batch: int, ctx: int) -> float:
    c = model.cfg
    e, k = c.n_routed_experts, c.num_experts_per_tok
    touched = e * (1 - (1 - k / e) ** batch)
    return (
        wb["other"]
        + c.num_hidden_layers * touched * wb["per_expert"]
        + batch * wb["embed_row"]
        + batch * kv_bytes_per_row(model, ctx)
    )


# ----------------------------------------------------------------------------------------- the engine


def replay_ms(runner, match) -> dict[str, float]:
    """Median ms of each captured graph whose key ``match`` accepts, replayed alone (20 times)."""
    out = {}
    for key in list(runner.graphs):
        if not match(key):
            continue
        step = runner.graphs.steps[key]
        for _ in range(3):
            step.replay()
        sync()
        ts = []
        for _ in range(1 if SMOKE else 20):
            t0 = time.perf_counter()
            step.replay()
            sync()
            ts.append((time.perf_counter() - t0) * 1e3)
        out[str(key)] = sorted(ts)[len(ts) // 2]
    return out


def profile_graph(runner, batch: int) -> list[dict]:
    """GPU time per kernel name over 3 replays of the plain decode graph of ``batch`` rows (largest context
    bucket): where a V4.1 step spends its time."""
    from torch.profiler import ProfilerActivity, profile

    keys = sorted(k for k in runner.graphs if k and k[0] == batch and k[-1] == 1)
    if not keys or SMOKE:
        return []
    step = runner.graphs.steps[keys[-1]]
    step.replay()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.replay()
        sync()
    rows = sorted(
        ((e.key, e.self_device_time_total / 3 / 1e3, e.count // 3) for e in prof.key_averages()),
        key=lambda r: -r[1],
    )
    total = sum(r[1] for r in rows)
    log(f"profile batch {batch} {keys[-1]}: {total:.3f} ms of kernels per step")
    top = [{"kernel": name[:100], "ms": round(ms, 4), "calls": n} for name, ms, n in rows[:25]]
    for r in top:
        log("   ", r)
    return top


def host_profile_text(prof) -> dict[str, str]:
    """The 40 costliest functions of a profiled ``generate`` (Python's cProfile: host time; the step times of
    a profiled run are not figures), by own time and by cumulative time."""
    out = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(40)
        out[key] = buf.getvalue()[-12000:]
    return out


def slice_prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    """``n`` random prompts of ``length`` ids (the first ``b`` are the same for any ``n >= b``)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def section_engine(args, model, rt, ceil) -> None:
    from cuda_settings import cuda_env

    from deepinfer_core import SamplingParams
    from deepinfer_core.config import load_config
    from deepinfer_core.engine.llm import LLM
    from deepinfer_core.engine.llm_engine import LLMEngine

    backend = "reference" if SMOKE else "cuda_sm100"
    wb = weight_bytes41(model)
    prompts = [
        {"prompt_token_ids": p} for p in slice_prompts(max(args.batches), args.prompt, model.vocab_size)
    ]
    ctx = args.prompt + args.tokens
    rows, tokens = {}, {}
    ks = [k for k in args.ks if k]  # --ks 0: plain decode only
    for k in [0, *ks]:
        spec = {"method": "dspark", "num_speculative_tokens": k} if k else None
        config = load_config(
            environ={} if SMOKE else cuda_env(),
            backend=backend,
            max_model_len=ctx + 16,
            max_num_seqs=max(args.batches),
            max_num_batched_tokens=max(8192, args.prompt),
            kv_cache_memory_bytes=args.kv_bytes,
            speculative_config=spec,
            enforce_eager=SMOKE,
        )
        engine = LLMEngine(
            config, model, rt.backends, None, rt.registry.structured_backends, rt.registry.proposers
        )
        llm = LLM.from_engine(engine)
        steps = _timed_steps(engine)
        tag = f"dspark_k{k}" if k else "plain"
        for b in args.batches:
            sp = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
            llm.generate(prompts[:b], sp, use_tqdm=False)  # captures this batch's graphs
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
        if k == 0:
            graphs = replay_ms(runner, lambda key: key and key[0] != "draft" and key[-1] == 1)
        else:
            graphs = replay_ms(runner, lambda key: True)
        for key, ms in graphs.items():
            log("v41 graph", tag, key, f"{ms:.3f} ms")
        RESULTS.setdefault("graphs", {})[tag] = graphs
        save(args.out)
        engine = llm = runner = None
        if not SMOKE:
            torch.cuda.empty_cache()
            # the engines share these memory ops: the next one captures into a fresh graph pool (the old pool,
            # its graphs freed, is released, and capturing into its stale handle fails an allocator assert)
            rt.backends.memory._pool = None
    for b, row in rows.items():
        row["roofline_bytes"] = decode_bytes(model, wb, b, ctx)
        row["roofline_ms"] = row["roofline_bytes"] / ceil["copy_bytes_per_s"] * 1e3 if ceil else float("nan")
        for k in ks:
            row[f"dspark_k{k}"]["greedy_equal_plain"] = tokens[(k, b)] == tokens[(0, b)]
    RESULTS["engine"] = {
        "prompt": args.prompt,
        "tokens": args.tokens,
        "rows": list(rows.values()),
        "bytes": wb,
    }
    log("v41 engine", RESULTS["engine"])


def save(out: str) -> None:
    with open(os.path.join(out, "v41_slice.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def main() -> None:
    from deepinfer_core.config import load_config
    from deepinfer_core.runtime import build_runtime

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument(
        "--ks", type=int, nargs="+", default=[5], help="DSpark drafts a round (0: plain decode only)"
    )
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--kv-bytes", type=int, default=16 << 30)
    ap.add_argument("--profile", type=int, default=0, help="profile the plain decode graph of this batch")
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
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU reference backend")
    args = ap.parse_args()
    ENGRAM_IN_STEP[0] = args.engram_in_step
    if SMOKE:
        args.kv_bytes = min(args.kv_bytes, 256 << 20)
    os.makedirs(args.out, exist_ok=True)
    RESULTS["meta"] = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "argv": sys.argv,
        "torch": torch.__version__,
    }
    backend = "reference" if SMOKE else "cuda_sm100"
    config = load_config(environ={}, backend=backend)
    rt = build_runtime(config) if SMOKE else cuda_runtime(config)
    dev = rt.backends.memory.device
    ceil = {} if SMOKE else ceilings(dev)
    RESULTS["ceilings"] = ceil
    dtype = torch.float32 if SMOKE or args.float32 else torch.bfloat16
    with tempfile.TemporaryDirectory(prefix="v41slice_") as tmp:
        try:
            model = build_v41_slice(rt.backends, dtype, SMOKE, Path(tmp))
            RESULTS["build"] = {
                "dtype": str(dtype),
                "engram_in_step": model.engram_in_step,
                "layers": model.cfg.num_hidden_layers,
                "roles": [str(r) for r in model.cfg.roles],
            }
            if not SMOKE:
                RESULTS["build"]["gpu_bytes_allocated"] = torch.cuda.memory_allocated()
            section_engine(args, model, rt, ceil)
        except Exception:  # noqa: BLE001 - keep what was measured
            log(traceback.format_exc()[-3000:])
            RESULTS["error"] = traceback.format_exc()[-1500:]
        save(args.out)


if __name__ == "__main__":
    main()
