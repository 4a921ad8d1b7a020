"""Check every cuda_sm100 kernel against the reference ops at DeepSeek-V4-Flash sizes, then time it.

Run on a CUDA GPU from the repository root:

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python benchmarks/gpu/check.py [--out DIR] [--sweep]

Correctness: fresh random inputs (never zeros), outputs poisoned with NaN first (every element must be
written), relative error ``||out - ref|| / ||ref||`` against the reference op (float64 where the
reference op cannot run on the device), bounds per dtype as METHOD.md says. Timing: median of
``triton.testing.do_bench``; each kernel's floor is max(bytes / copy bandwidth, flops / matmul rate),
both ceilings measured at the start of the same run.
"""

# ruff: noqa: B023 - every lambda here is called before its loop variables change
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

from check_attention import check_attention  # noqa: F401 - a section, called by name
from check_common import (  # noqa: E402 - after check_common has set TRITON_INTERPRET for --smoke
    BF16,
    BOUND,
    CEIL,
    DEV,
    EXPERTS,
    F32,
    HC,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    IDX_TOPK,
    INTER,
    ROPE_DIM,
    ROWS,
    SMOKE,
    TOPK,
    VOCAB,
    WINDOW,
    G,
    bench,
    ceilings,
    poisoned,
    record,
    rel_err,
    rnd,
    sizes,
    table,
    torch,
    triton,
)
from check_fusions import (
    check_dense_fusions,
    check_hc_fused,
    check_plan,  # noqa: F401 - a section, called by name
    check_v41_side_coeffs,
)
from check_probs import check_probs  # noqa: F401 - a section, called by name
from cuda_settings import use_env_settings

from deepinfer_core.ops import draws  # noqa: E402
from deepinfer_core.ops.mhc import HCParams  # noqa: E402
from deepinfer_core.ops.quant_formats import dequant  # noqa: E402
from deepinfer_core.ops.reference import reference_op  # noqa: E402
from deepinfer_core.ops.sampling import SamplingTensors  # noqa: E402
from deepinfer_core.ops.weights import ExpertWeights, QuantizedWeight  # noqa: E402
from deepinfer_core.testing.kit import to_device  # noqa: E402
from deepinfer_cuda_sm100 import dispatch  # noqa: E402
from deepinfer_cuda_sm100.ops.dense import CudaDenseOps  # noqa: E402
from deepinfer_cuda_sm100.ops.moe import CudaMoEOps  # noqa: E402
from deepinfer_cuda_sm100.ops.sampling import CudaSamplingOps  # noqa: E402

# ----------------------------------------------------------------------------- dense


def check_dense():
    ops, ref = CudaDenseOps(), reference_op("dense")
    for T in sizes(16, 8192):
        x, w = rnd(T, HIDDEN, scale=3.0), rnd(HIDDEN, dtype=F32)
        out = poisoned(lambda: ops.rms_norm(x, w, 1e-6))
        err = rel_err(out, ref.rms_norm(x, w, 1e-6)) if T == 16 else None
        record(
            "rms_norm",
            f"{T}x{HIDDEN}",
            err,
            BOUND["bf16"],
            bench(lambda: ops.rms_norm(x, w, 1e-6)),
            4 * x.numel(),
        )
    inv_freq = 1.0 / (10000 ** (torch.arange(0, ROPE_DIM, 2, device=DEV).float() / ROPE_DIM))
    for T in sizes(16, 2048):
        q, pos = rnd(T, HEADS, HEAD_DIM), torch.randint(0, 1 << 20, (T,), device=DEV, generator=G)
        out = poisoned(lambda: ops.rope(q, pos, inv_freq, True))
        err = rel_err(out, ref.rope(q, pos, inv_freq, True)) if T == 16 else None
        record("rope(inverse)", f"{T}x{HEADS}x{HEAD_DIM}", err, BOUND["bf16"], bench(lambda: ops.rope(q, pos, inv_freq)),
               4 * q.numel())  # fmt: skip
    fn, base = (
        rnd((2 + HC) * HC, HC * HIDDEN, dtype=F32, scale=0.02),
        rnd((2 + HC) * HC, dtype=F32, scale=0.5),
    )
    scale = rnd(3, dtype=F32).abs() + 0.5
    hc = HCParams(fn, base, scale, 20, 1e-6, 1e-6)
    for i, T in enumerate(sizes(16, 1, 8, 64, 8192)):
        x = rnd(T, HC, HIDDEN)
        outs = poisoned(lambda: ops.hc_pre(x, hc))
        err = max(rel_err(a, b) for a, b in zip(outs, ref.hc_pre(x, hc))) if i < 3 else None
        ms = bench(lambda: ops.hc_pre(x, hc))
        by = 2 * x.numel() + 2 * T * HIDDEN + 4 * fn.numel()
        record("hc_pre", f"{T}x{HC}x{HIDDEN}", err, BOUND["bf16"], ms, by, 2 * x.numel() * fn.shape[0])
        from deepinfer_cuda_sm100.kernels import mhc

        record("  hc_pre launch 1 (mixes)", f"{T}x{HC}x{HIDDEN}", None, None, bench(lambda: mhc.mixes_partials(x, fn)),
               2 * x.numel() + 4 * fn.numel(), 2 * x.numel() * fn.shape[0])  # fmt: skip
        y, post, comb = rnd(T, HIDDEN), outs[1], outs[2]
        out = poisoned(lambda: ops.hc_post(y, x, post, comb))
        err = rel_err(out, ref.hc_post(y, x, post, comb)) if T == 16 else None
        record("hc_post", f"{T}x{HC}x{HIDDEN}", err, BOUND["bf16"], bench(lambda: ops.hc_post(y, x, post, comb)),
               2 * T * HIDDEN * (1 + 2 * HC))  # fmt: skip
    check_hc_fused(ops, fn, base, scale)
    check_v41_side_coeffs(ops, fn, base, scale)
    for fmt in ("fp8_block", "fp4_e2m1"):
        w = rand_qweight(fmt, HIDDEN, HIDDEN)
        wc = to_device(w, torch.device("cpu"))
        for T in sizes(16, 1, 4096):  # one row: the decode GEMV (FP4 in float16 pairs)
            x = rnd(T, HIDDEN)
            out = poisoned(lambda: ops.linear(x, w))
            err = rel_err(out, ref.linear(x.cpu(), wc)) if T in (1, 16) else None
            wbytes = w.data.numel() + 4 * w.scale.numel()
            record(f"linear[{fmt}]", f"{T}x{HIDDEN}->{HIDDEN}", err, BOUND["bf16"], bench(lambda: ops.linear(x, w)),
                   wbytes + 2 * x.numel() * 2, 2 * T * HIDDEN * HIDDEN)  # fmt: skip
        wd = dequant(wc, BF16).to(DEV)
        x = rnd(4096, HIDDEN)
        record("  cuBLAS bf16 same shape", f"4096x{HIDDEN}->{HIDDEN}", None, None, bench(lambda: x @ wd.T),
               2 * wd.numel() + 4 * x.numel(), 2 * 4096 * HIDDEN * HIDDEN)  # fmt: skip
    w1, w3, w2 = (
        rand_qweight("fp8_block", o, i) for o, i in ((INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER))
    )
    for T in sizes(16, 4096):
        x = rnd(T, HIDDEN)
        out = poisoned(lambda: ops.swiglu_mlp(x, w1, w3, w2, 10.0))
        cpu = [to_device(w, torch.device("cpu")) for w in (w1, w3, w2)]
        err = rel_err(out, ref.swiglu_mlp(x.cpu(), *cpu, 10.0)) if T == 16 else None
        record("swiglu_mlp[fp8]", f"{T}x{HIDDEN}, I={INTER}", err, BOUND["bf16"],
               bench(lambda: ops.swiglu_mlp(x, w1, w3, w2, 10.0)), 3 * HIDDEN * INTER + 4 * T * HIDDEN,
               6 * T * HIDDEN * INTER)  # fmt: skip
    check_dense_fusions(ops, ref, w1, w3, w2)


def rand_qweight(fmt, out_f, in_f) -> QuantizedWeight:
    """Valid random weights in ``fmt``, made on the device (random codes, power-of-two scales)."""
    if fmt in ("fp8_block", "fp8_block32"):  # 128 x 128 or (V4.1) 32 x 32 scale blocks
        b = 128 if fmt == "fp8_block" else 32
        data = (
            (torch.randn(out_f, in_f, device=DEV, generator=G) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        )
        scale = torch.exp2(torch.randint(-14, -8, (triton.cdiv(out_f, b), triton.cdiv(in_f, b)), device=DEV,
                                         generator=G).float())  # fmt: skip
    else:
        data = torch.randint(0, 256, (out_f, in_f // 2), device=DEV, generator=G, dtype=torch.int32).to(
            torch.uint8
        )
        scale = torch.exp2(torch.randint(-9, -5, (out_f, in_f // 32), device=DEV, generator=G).float())
    return QuantizedWeight(data, scale, fmt, (out_f, in_f))


# ----------------------------------------------------------------------------- MoE


def make_experts(fmt) -> ExpertWeights:
    def one(o, i):
        return rand_qweight(fmt, o, i) if fmt != "plain" else rnd(o, i, scale=0.02)

    return ExpertWeights([one(INTER, HIDDEN) for _ in range(EXPERTS)], [one(INTER, HIDDEN) for _ in range(EXPERTS)],
                         [one(HIDDEN, INTER) for _ in range(EXPERTS)], list(range(EXPERTS)))  # fmt: skip


def cpu_subset(ew: ExpertWeights, used: set[int]) -> ExpertWeights:
    pick = [
        [to_device(w, torch.device("cpu")) if i in used else None for i, w in enumerate(ws)]
        for ws in (ew.w1, ew.w3, ew.w2)
    ]
    return ExpertWeights(*pick, ew.expert_ids)


#: V4.1-Flash's FP8 projections (32 x 32 scale blocks): hidden 5,120; q LoRA 1,280 -> 64 x 512; the shared
#: expert 5,120 -> 2,304
V41_LINEARS = ((1280, 5120), (32768, 1280), (5120, 8192), (2304, 5120)) if not SMOKE else ((40, 72), (96, 40))


def check_fp8_block32() -> None:
    """V4.1's ``fp8_block32`` weights in the grouped GEMM: decode (1 and 16 rows) and a prefill chunk."""
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    ops, ref = CudaDenseOps(), reference_op("dense")
    for o, i in V41_LINEARS:
        w = rand_qweight("fp8_block32", o, i)
        wc = to_device(w, torch.device("cpu"))
        for T in sizes(16, 1, 4096):
            x = rnd(T, i)
            out = poisoned(lambda: ops.linear(x, w))
            err = rel_err(out, ref.linear(x.cpu(), wc)) if T in (1, 16) else None
            wbytes = w.data.numel() + 4 * w.scale.numel()
            record("linear[fp8_block32]", f"{T}x{i}->{o}", err, BOUND["bf16"], bench(lambda: ops.linear(x, w)),
                   wbytes + 2 * T * (i + o), 2 * T * i * o)  # fmt: skip


def check_dequant() -> None:
    """Prefill's quantized dense GEMMs on dequantised weights (``gg.dequantize`` then cuBLAS,
    ``dispatch.dequant_gemm``): the dequantised weight bit for bit against the reference's, in each format; the
    linear at a prefill chunk against float32 products of the same bf16 operands."""
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

    ops = CudaDenseOps()
    for fmt, (o, i) in [
        ("fp8_block", (4096, 1024)),
        ("fp8_block32", (1280, 5120)),
        ("fp4_e2m1", (2048, 4096)),
    ]:
        w = rand_qweight(fmt, o, i)
        tab = gg.WeightTable.build([w], DEV)
        got = poisoned(lambda: gg.dequantize(tab, BF16)[0])
        ref = dequant(w, BF16)
        bad = int((got.view(torch.int16) != ref.view(torch.int16)).sum())
        record(f"dequantize[{fmt}]", f"{o}x{i}", float(bad), 0.5, bench(lambda: gg.dequantize(tab, BF16)),
               w.data.numel() + 4 * w.scale.numel() + 2 * o * i, note="err: differing elements")  # fmt: skip
        for T in sizes(2048, 16):
            x = rnd(T, i)
            on = T >= dispatch.settings().dequant_gemm_rows
            out = poisoned(lambda: ops.linear(x, w))
            err = rel_err(out, x.float() @ ref.float().T)
            record(f"linear[{fmt}]{'[dequant]' if on else ''}", f"{T}x{i}->{o}", err, BOUND["bf16"],
                   bench(lambda: ops.linear(x, w)), w.data.numel() + 2 * T * (i + o), 2 * T * i * o)  # fmt: skip


def check_act_quant() -> None:
    """The release's activation quantiser (``activation_quant="fp8"``) bit for bit against the core's on the GPU, at
    V4.1-Flash's GEMM input widths (hidden, q LoRA, shared / expert intermediate, ``wo_b``'s input), and the FP8
    32 x 32 linear with a marked weight against the reference's."""
    from deepinfer_core.ops.act_quant import fp8_act_roundtrip as core_roundtrip
    from deepinfer_cuda_sm100.kernels.act_quant import fp8_act_roundtrip

    for k in (5120, 1280, 2304, 8192) if not SMOKE else (64, 160):
        for T in sizes(16, 1, 8192):
            x = rnd(T, k, scale=3.0)
            got = poisoned(lambda: fp8_act_roundtrip(x))
            exact = torch.equal(got.cpu().view(torch.int16), core_roundtrip(x.cpu()).view(torch.int16))
            record("act_quant[fp8_roundtrip]", f"{T}x{k}", 0.0 if exact else 1.0, 0.5,
                   bench(lambda: fp8_act_roundtrip(x)), 4 * T * k)  # fmt: skip
    ops, ref = CudaDenseOps(), reference_op("dense")
    for o, i in V41_LINEARS if not SMOKE else ((40, 64), (96, 160)):
        w = rand_qweight("fp8_block32", o, i)
        w.act_block = 32
        wc = to_device(w, torch.device("cpu"))
        for T in sizes(16, 1, 4096) + ((256,) if not SMOKE else ()):
            x = rnd(T, i)
            out = poisoned(lambda: ops.linear(x, w))
            err = rel_err(out, ref.linear(x.cpu(), wc)) if T in (1, 16, 256) else None
            wbytes = w.data.numel() + 4 * w.scale.numel()
            path = "fp8_mma" if dispatch.mx_gemm_config(T, 32) is not None else "w8a16"
            record(f"linear[fp8_block32,act_fp8,{path}]", f"{T}x{i}->{o}", err, BOUND["bf16"],
                   bench(lambda: ops.linear(x, w)), wbytes + 2 * T * (i + o), 2 * T * i * o)  # fmt: skip


def check_moe():
    ops, ref = CudaMoEOps(), reference_op("moe")
    bias = rnd(EXPERTS, dtype=F32, scale=0.1)
    for T in sizes(16, 8192):
        logits = rnd(T, EXPERTS, dtype=F32, scale=2.0)
        w, ids = ops.route_topk(logits, bias, TOPK, "sqrtsoftplus", 1.5)
        err = None
        if T == 16:
            rw, rids = ref.route_topk(logits, bias, TOPK, "sqrtsoftplus", 1.5)
            same = torch.equal(ids.sort(1).values.cpu(), rids.sort(1).values.cpu())
            err = (
                rel_err(w.gather(1, ids.argsort(1)), rw.gather(1, rids.argsort(1))) if same else float("inf")
            )
        record("route_topk[sqrtsoftplus]", f"T={T} E={EXPERTS} k={TOPK}", err, BOUND["f32"],
               bench(lambda: ops.route_topk(logits, bias, TOPK, "sqrtsoftplus", 1.5)), 4 * T * EXPERTS + 16 * T * TOPK)  # fmt: skip
    for fmt in ("plain", "fp8_block", "fp4_e2m1"):
        ew = make_experts(fmt)
        wb = {"plain": 2.0, "fp8_block": 1.0, "fp4_e2m1": 0.5 + 4 / 32}[fmt] * 3 * HIDDEN * INTER
        for T in sizes(4, 64, 4096):
            x = rnd(T, HIDDEN)
            logits = rnd(T, EXPERTS, dtype=F32, scale=2.0)
            w, ids = ops.route_topk(logits, bias, TOPK, "sqrtsoftplus", 1.5)
            out = poisoned(lambda: ops.experts(x, ids, w, ew, 10.0))
            err = None
            if T == 4:
                used = set(ids.flatten().tolist())
                sub = cpu_subset(ew, used) if fmt != "plain" else ew
                dev_ = torch.device("cpu") if fmt != "plain" else DEV
                err = rel_err(out, ref.experts(x.to(dev_), ids.to(dev_), w.to(dev_), sub, 10.0))
            active = int(torch.unique(ids).numel())
            record(f"experts[{fmt}]", f"T={T} E={EXPERTS} k={TOPK} D={HIDDEN} I={INTER} active={active}", err,
                   BOUND["bf16"], bench(lambda: ops.experts(x, ids, w, ew, 10.0)), active * wb + 2 * T * HIDDEN * 2,
                   6 * T * TOPK * HIDDEN * INTER)  # fmt: skip
        ew = None
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- sampling


def _per_row(p, gens):  # a generator a row, as sampling drew before plugin API 2.8
    return torch.stack(
        [(r / torch.empty_like(r).exponential_(generator=g)).argmax() for r, g in zip(p, gens)]
    )


def check_sampling():
    ops, ref = CudaSamplingOps(), reference_op("sampling")
    B, V = (64 if not SMOKE else 4), VOCAB
    logits = rnd(B, V, dtype=F32, scale=3.0)
    mask = torch.rand(B, V, device=DEV, generator=G) < 0.01
    counts = (torch.rand(B, V, device=DEV, generator=G) < 0.005).int() * 2
    pen = [rnd(B, dtype=F32).abs() * 0.3, rnd(B, dtype=F32).abs() * 0.3, 1 + rnd(B, dtype=F32).abs() * 0.2]
    out = poisoned(lambda: ops.apply_penalties(logits, mask, counts, *pen))
    record("apply_penalties", f"B={B} V={V}", rel_err(out, ref.apply_penalties(logits, mask, counts, *pen)), BOUND["f32"],
           bench(lambda: ops.apply_penalties(logits, mask, counts, *pen)), B * V * (4 + 1 + 4 + 4))  # fmt: skip
    record("  torch reference penalties", f"B={B} V={V}", None, None,
           bench(lambda: ref.apply_penalties(logits, mask, counts, *pen)), B * V * (4 + 1 + 4 + 4))  # fmt: skip
    bits = torch.randint(
        -(2**31), 2**31 - 1, (B, triton.cdiv(V, 32)), device=DEV, generator=G, dtype=torch.int64
    ).int()
    out = poisoned(lambda: ops.apply_bitmask(logits, bits))
    ok = torch.equal(out, ref.apply_bitmask(logits, bits))
    record("apply_bitmask", f"B={B} V={V}", 0.0 if ok else float("inf"), BOUND["f32"],
           bench(lambda: ops.apply_bitmask(logits, bits)), B * V * 8 + bits.numel() * 4)  # fmt: skip
    record("  torch reference bitmask", f"B={B} V={V}", None, None, bench(lambda: ref.apply_bitmask(logits, bits)),
           B * V * 8 + bits.numel() * 4)  # fmt: skip
    params = SamplingTensors(rnd(B, dtype=F32).abs() + 0.3, torch.randint(0, 100, (B,), device=DEV, generator=G),
                             torch.rand(B, device=DEV, generator=G) * 0.5 + 0.5, torch.rand(B, device=DEV, generator=G) * 0.1)  # fmt: skip
    nucleus = SamplingTensors(params.temperature, torch.zeros_like(params.top_k), params.top_p, params.min_p)
    for name, prm in (("probs (top-k, top-p, min-p)", params), ("probs (top-p, min-p; no top-k)", nucleus)):
        p = ops.probs(logits, prm)
        want = ref.probs(logits, prm)
        same = torch.equal(p > 0, want > 0)  # the same tokens survive every cut
        record(name, f"B={B} V={V}", rel_err(p, want) if same else float("inf"), BOUND["f32"],
               bench(lambda: ops.probs(logits, prm)), B * V * 8)  # fmt: skip
        record("  reference op probs", f"B={B} V={V}", None, None, bench(lambda: ref.probs(logits, prm)),
               B * V * 8)  # fmt: skip
    for b in (
        1,
        5,
        16,
        1,
        5,
        16,
    ):  # graphed probs (up to 16 rows): each call's own logits, replayed after the first
        lg = rnd(b, V, dtype=F32, scale=3.0)
        prm = SamplingTensors(rnd(b, dtype=F32).abs() + 0.3, torch.randint(0, 100, (b,), device=DEV, generator=G),
                              torch.rand(b, device=DEV, generator=G) * 0.5 + 0.5, torch.rand(b, device=DEV, generator=G) * 0.1)  # fmt: skip
        p, want = ops.probs(lg, prm), ref.probs(lg, prm)
        same = torch.equal(p > 0, want > 0)
        record(f"probs graphed[{b}]", f"B={b} V={V}", rel_err(p, want) if same else float("inf"), BOUND["f32"],
               bench(lambda: ops.probs(lg, prm)), b * V * 8)  # fmt: skip
    p = ops.probs(logits, params)
    for b in (
        1,
        B,
    ):  # the keyed draw: the Triton launches, the core's torch draws, a generator a row (before 2.8)
        pb_, seeds = p[:b].contiguous(), torch.randint(0, 2**62, (b,), device=DEV, generator=G)
        at = torch.randint(0, 2**20, (b,), device=DEV, generator=G)
        ok = torch.equal(ops.sample_keyed(pb_, seeds, at), draws.draw(pb_, seeds, at))
        gens = [torch.Generator(DEV).manual_seed(i) for i in range(b)]
        record(f"sample_keyed[{b}]", f"B={b} V={V}", 0.0 if ok else float("inf"), BOUND["f32"],
               bench(lambda: ops.sample_keyed(pb_, seeds, at)), b * V * 4)  # fmt: skip
        record("  core torch draws.draw", f"B={b} V={V}", None, None, bench(lambda: draws.draw(pb_, seeds, at)),
               b * V * 4)  # fmt: skip
        record(
            "  a generator a row (before 2.8)",
            f"B={b} V={V}",
            None,
            None,
            bench(lambda: _per_row(pb_, gens)),
            b * V * 4,
        )


# ----------------------------------------------------------------------------- sweeps


def sweep():
    """Time alternative launch configurations of the two heaviest kernels (results go to NOTES.md)."""
    import deepinfer_cuda_sm100.kernels.sparse_attention as sa

    S = 1 << 20 if not SMOKE else 512
    kv_pool, cmp_pool, sinks = rnd(S, HEAD_DIM), rnd(S // 4, HEAD_DIM), rnd(HEADS, dtype=F32)
    orig = dispatch.attention_config
    for T in sizes(64, 2048):
        q = rnd(T, HEADS, HEAD_DIM)
        kv_slots = torch.randint(0, S, (T, WINDOW), device=DEV, generator=G)
        cmp_slots = torch.randint(0, S // 4, (T, IDX_TOPK), device=DEV, generator=G)
        for cfg in [(16, 32, 4, 2), (16, 64, 4, 2), (16, 32, 8, 2), (32, 32, 8, 2), (64, 16, 8, 2), (16, 16, 4, 3),
                    (32, 64, 8, 2), (64, 32, 8, 1)]:  # fmt: skip
            dispatch.attention_config = lambda *a, c=cfg, **k: dispatch.AttentionConfig(*c)
            try:
                ms = bench(
                    lambda: sa.sparse_attention(q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, 0.04)
                )
                print(f"sweep attention T={T} cfg(bh,bn,warps,stages)={cfg}: {ms * 1e3:.1f} us", flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result too
                print(
                    f"sweep attention T={T} cfg={cfg}: failed {type(exc).__name__}: {str(exc)[:120]}",
                    flush=True,
                )
    dispatch.attention_config = orig
    ops = CudaMoEOps()
    orig_g = dispatch.gemm_config
    for fmt in ("fp8_block", "fp4_e2m1"):
        ew = make_experts(fmt)
        bias = rnd(EXPERTS, dtype=F32, scale=0.1)
        for T in sizes(64, 4096):
            x = rnd(T, HIDDEN)
            w, ids = ops.route_topk(rnd(T, EXPERTS, dtype=F32), bias, TOPK, "sqrtsoftplus", 1.5)
            cands = [(16, 64, 128, 4, 4), (16, 128, 128, 4, 3), (32, 64, 128, 4, 4), (64, 64, 64, 4, 4),
                     (64, 128, 64, 8, 3), (128, 64, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 128, 8, 3)]  # fmt: skip
            for c in cands:
                if fmt == "fp8_block" and 128 % c[2]:
                    continue
                dispatch.gemm_config = lambda *a, c=c, **k: dispatch.GemmConfig(*c)
                ops._prepared = type(ops._prepared)()
                try:
                    ms = bench(lambda: ops.experts(x, ids, w, ew, 10.0))
                    print(
                        f"sweep experts[{fmt}] T={T} cfg(bm,bn,bk,warps,stages)={c}: {ms * 1e3:.1f} us",
                        flush=True,
                    )
                except Exception as exc:  # noqa: BLE001
                    print(
                        f"sweep experts[{fmt}] T={T} cfg={c}: failed {type(exc).__name__}: {str(exc)[:120]}",
                        flush=True,
                    )
        dispatch.gemm_config = orig_g
        ew = None
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (Triton interpreter)")
    ap.add_argument("--only", default="dense,fp8_block32,dequant,plan,act_quant,attention,moe,sampling,probs")
    args = ap.parse_args()
    G.manual_seed(int(time.time()))
    smi = "cpu smoke run" if SMOKE else subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(f"date {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; {smi}; "
          f"torch {torch.__version__}; triton {triton.__version__}; arch {dispatch.arch()}; "
          f"cuda_sm100 {use_env_settings().model_dump()}; command: {' '.join(sys.argv)}", flush=True)  # fmt: skip
    ceilings()
    for part in args.only.split(","):
        t0 = time.time()
        globals()[f"check_{part}"]()
        print(f"[{part} done in {time.time() - t0:.0f} s]", flush=True)
    if args.sweep:
        sweep()
    out = table()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "check.json"), "w") as f:
        json.dump({"ceilings": CEIL, "rows": ROWS}, f, indent=1)
    print(out)
    bad = [r["kernel"] for r in ROWS if r["ok"] is False]
    print("ALL CHECKS PASSED" if not bad else f"FAILED: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
