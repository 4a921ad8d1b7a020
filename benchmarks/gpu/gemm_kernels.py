"""The quantized GEMM kernels at V4-Flash shapes on the GPU: checked against the dequantised matmul, timed.

Decode (memory-bound; % of the copy bandwidth measured in the same run): the FP8 attention projections at
1 and 4 rows, and the FP4 routed experts (256 x 2048 x 4096, top-6) at batch 1, 16, 64 and 256, each on
the tensor-core kernel and on the CUDA-core GEMV kernel (``kernels/gemv.py``), plus GEMV launch variants.
Every timing is of a CUDA graph of ``REPS`` calls (eager launches of these sizes time the host, NOTES.md v5).

Prefill (compute-bound; % of the bf16 matmul rate measured in the same run): the FP8 dense projections
at 8192 rows on the Triton kernel, on the TileLang kernel (``kernels/tl_fp8_gemm.py``, when tilelang is
installed) and, as a peer, cuBLAS on a weight dequantised to bf16 beforehand.

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python benchmarks/gpu/gemm_kernels.py [--out DIR]
"""

# ruff: noqa: B023 - every lambda is called before its loop variables change
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
from cuda_settings import use_env_settings
from gemm_tiles import forced

from deepinfer_core.ops.quant_formats import FP4_BLOCK, FP8_BLOCK, _e2m1_lut
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.weights import ExpertWeights, QuantizedWeight
from deepinfer_cuda_sm100 import dispatch, settings
from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

DEV = torch.device("cuda")
REPS = 10
#: decode timings cycle through this many bytes of distinct weights (``graph_ms``), 10x the H200's L2
ROTATE_BYTES = 512 << 20
#: and the experts through this many routings of random logits (each touching its own ~6 experts)
ROUTINGS = 8
G = torch.Generator(DEV).manual_seed(7)
ROWS: list[dict] = []
#: decode row counts (``--rows``): the dense projections at each, the experts at each but 4
DECODE_ROWS = [1, 4, 16, 64, 256]
#: tensor-core tile variants for the FP4 experts at 64 and 256 rows: (block_m, block_n, block_k, warps, stages)
TC_VARIANTS = [(16, 64, 128, 4, 3), (16, 128, 64, 4, 3), (32, 64, 64, 4, 3), (16, 64, 64, 8, 3), (16, 32, 128, 4, 4),
               (32, 128, 64, 4, 3)]  # fmt: skip
#: tensor-core variants for the FP8 linears at 64 and 256 rows
FP8_TC_VARIANTS = [(64, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 64, 128, 4, 3), (128, 128, 128, 8, 3),
                   (128, 64, 128, 4, 3)]  # fmt: skip
#: GEMV launch variants tried beside the default: (block_n, block_k, num_warps[, block_m[, num_stages]])
VARIANTS = {
    "fp8_block": [(16, 512, 4), (8, 2048, 4), (4, 1024, 4), (8, 1024, 8), (16, 1024, 4), (32, 512, 4), (16, 256, 4),
                  (8, 1024, 4, 1, 3), (16, 512, 4, 1, 3)],
    "fp4_e2m1": [(16, 1024, 4), (16, 512, 4), (64, 512, 4), (16, 256, 4), (32, 1024, 4), (64, 256, 4), (32, 256, 4),
                 (32, 512, 8), (64, 512, 8), (32, 512, 4, 1, 3), (32, 256, 2), (16, 512, 2)],
}  # fmt: skip
#: GEMV variants for the experts' down projection alone (gate+up as dispatched): at 32 x 512 its 768 programs
#: take more than one wave at batch 1 (NOTES.md v12)
DOWN_VARIANTS = [(64, 512, 4), (16, 512, 4), (32, 512, 2), (64, 256, 4), (16, 1024, 4), (64, 512, 8)]


def fp8(n: int, k: int) -> QuantizedWeight:
    data = (torch.randn(n, k, device=DEV, generator=G) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    exps = torch.randint(
        -14, -8, (triton.cdiv(n, FP8_BLOCK), triton.cdiv(k, FP8_BLOCK)), device=DEV, generator=G
    )
    return QuantizedWeight(data, torch.exp2(exps.float()), "fp8_block", (n, k))


def fp4(n: int, k: int) -> QuantizedWeight:
    data = torch.randint(0, 256, (n, k // 2), device=DEV, generator=G, dtype=torch.int32).to(torch.uint8)
    scale = torch.exp2(torch.randint(-9, -5, (n, k // 32), device=DEV, generator=G).float())
    return QuantizedWeight(data, scale, "fp4_e2m1", (n, k))


def dequantize(w: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The dequantised weight, computed on the GPU (``formats.dequant`` works block row by row on the host)."""
    n, k = w.shape
    if w.format == "fp8_block":
        s = w.scale.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
        return (w.data.float() * s).to(dtype)
    codes = torch.stack([w.data & 0x0F, w.data >> 4], dim=-1).view(n, k).long()
    return (_e2m1_lut(DEV)[codes] * w.scale.repeat_interleave(FP4_BLOCK, 1)).to(dtype)


def nbytes(w: QuantizedWeight) -> int:
    """Bytes the kernels read: FP4 scales as ue8m0 bytes (``grouped_gemm.ue8m0_bytes``), FP8's as float32."""
    return w.data.numel() * w.data.element_size() + w.scale.numel() * (1 if w.format == "fp4_e2m1" else 4)


def rel_err(a: torch.Tensor, r: torch.Tensor) -> float:
    a, r = a.double(), r.double()
    return float((a - r).norm() / r.norm().clamp_min(1e-30)) if not torch.isnan(a).any() else float("inf")


def graph_ms(fn, copies: int = 1) -> float:
    """Milliseconds per call of ``fn(i)``, replayed from a CUDA graph of at least ``REPS`` calls cycling
    ``i`` through ``range(copies)`` (median of 5). ``copies`` distinct weights (or routings) keep a call from
    reading what the previous calls left in L2: a decode step streams ~2 GB of weights between two uses of
    one matrix, while a 32 MB projection timed back to back is served mostly from the 50 MB L2."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # every copy once outside the graph: weight tables are built on first use
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    calls = max(REPS, copies)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i % copies)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return sorted(times)[2]


def record(**row) -> None:
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def ceilings() -> dict[str, float]:
    x = torch.empty(1 << 31, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    bw = 2 * x.numel() / (triton.testing.do_bench(lambda: y.copy_(x), return_mode="median") * 1e-3)
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    fl = 2 * 8192**3 / (triton.testing.do_bench(lambda: a @ a, return_mode="median") * 1e-3)
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 matmul {fl / 1e12:.0f} TFLOP/s", flush=True)
    return {"bw": bw, "flops": fl}


def kinds(fmt: str, rows: int):
    yield "tensor_cores", None
    if fmt == "fp4_e2m1":
        yield "tensor_cores_bits", None  # bit placement in Triton, not the PTX decode
        if rows <= 16:
            yield "tensor_cores_arith", None  # the FP4 decode of v1-v5, beside bit placement
    for v in FP8_TC_VARIANTS if rows >= 64 and fmt == "fp8_block" else ():
        yield "tensor_cores", v
    if rows <= 16:
        yield "gemv", None
        if fmt == "fp4_e2m1":
            yield "gemv_f32", None
            yield "gemv_bits", None
        for v in VARIANTS[fmt] if rows == 1 else ():
            yield "gemv", v
        for v in DOWN_VARIANTS if rows == 1 and fmt == "fp4_e2m1" else ():
            yield "gemv_down", v


def decode_dense(ceil) -> None:
    ops = CudaDenseOps()
    for name, (n, k) in {"wq_a 1024x4096": (1024, 4096), "wq_b 32768x1024": (32768, 1024),
                         "wkv 512x4096": (512, 4096), "wo_b 4096x8192": (4096, 8192)}.items():  # fmt: skip
        ws = [fp8(n, k) for _ in range(-(-ROTATE_BYTES // (n * k)))]
        w = ws[0]
        ref_w = dequantize(w, torch.float32)
        for m in DECODE_ROWS:
            x = torch.randn(m, k, device=DEV, generator=G).to(torch.bfloat16)
            ref = x.float() @ ref_w.T
            for kind, var in kinds("fp8_block", m):
                orig, pick = forced(kind, var)
                dispatch.gemm_config = pick
                try:
                    err = rel_err(ops.linear(x, w).float(), ref)
                    ms = graph_ms(lambda i: ops.linear(x, ws[i]), len(ws))
                finally:
                    dispatch.gemm_config = orig
                record(section="decode", op=f"fp8 linear {name}", rows=m, kernel=kind, variant=var, rel_err=err,
                       us=ms * 1e3, pct_copy_bw=100 * nbytes(w) / (ms * 1e-3) / ceil["bw"])  # fmt: skip


def decode_shared(ceil) -> None:
    """The shared expert at one row: FP8 gate+up (2 x 2048 x 4096, SwiGLU) then down, over the GEMV tiles."""
    ops = CudaDenseOps()
    inter, hidden = 2048, 4096
    mlps = [(fp8(inter, hidden), fp8(inter, hidden), fp8(hidden, inter))
            for _ in range(-(-ROTATE_BYTES // (3 * inter * hidden)))]  # fmt: skip
    x = torch.randn(1, hidden, device=DEV, generator=G).to(torch.bfloat16)
    w1, w3, w2 = mlps[0]
    d1, d3, d2 = (dequantize(w, torch.float32) for w in (w1, w3, w2))
    g, u = x.float() @ d1.T, x.float() @ d3.T
    h = torch.nn.functional.silu(g.clamp(max=10.0)) * u.clamp(-10.0, 10.0)
    ref = h.to(torch.bfloat16).float() @ d2.T
    for var in [None, (32, 512, 4), (16, 512, 4), (16, 1024, 4), (8, 2048, 4)]:
        orig, pick = forced("gemv", var)
        dispatch.gemm_config = pick
        try:
            err = rel_err(ops.swiglu_mlp(x, w1, w3, w2, 10.0).float(), ref)
            ms = graph_ms(lambda i: ops.swiglu_mlp(x, *mlps[i], 10.0), len(mlps))
        finally:
            dispatch.gemm_config = orig
        record(section="decode", op="fp8 shared expert 2048x4096 swiglu+down", rows=1, kernel="gemv", variant=var,
               rel_err=err, us=ms * 1e3, pct_copy_bw=100 * 3 * nbytes(w1) / (ms * 1e-3) / ceil["bw"])  # fmt: skip


def decode_experts(ceil) -> None:
    ops = CudaMoEOps()
    E, INTER, H, K = 256, 2048, 4096, 6
    ew = ExpertWeights([fp4(INTER, H) for _ in range(E)], [fp4(INTER, H) for _ in range(E)],
                       [fp4(H, INTER) for _ in range(E)], list(range(E)))  # fmt: skip
    per_expert = 3 * nbytes(ew.w1[0])
    bias = torch.zeros(E, device=DEV)
    ref_op = reference_op("moe")
    for t in [r for r in DECODE_ROWS if r != 4]:
        x = torch.randn(t, H, device=DEV, generator=G).to(torch.bfloat16)
        routes = [ops.route_topk(torch.randn(t, E, device=DEV, generator=G), bias, K, "sqrtsoftplus", 1.5)
                  for _ in range(ROUTINGS)]  # fmt: skip
        wts, ids = routes[0]
        touched = int(torch.unique(ids).numel())
        ref = None
        if t <= 16:  # the reference dequantises only the experts used, on the GPU
            used = set(ids.flatten().tolist())
            sub = [[dequantize(w, torch.bfloat16) if i in used else None for i, w in enumerate(ws)]
                   for ws in (ew.w1, ew.w3, ew.w2)]  # fmt: skip
            ref = ref_op.experts(x, ids, wts, ExpertWeights(*sub, ew.expert_ids), 10.0).float()
        tc = [(kind, v) for v in TC_VARIANTS for kind in ("tensor_cores", "tensor_cores_bits")]
        tried = list(kinds("fp4_e2m1", t)) + (tc if t == 256 else [])
        against = (
            "reference" if ref is not None else "tensor_cores"
        )  # above 16 rows: the first (checked) kernel
        for kind, var in tried:
            orig, pick = forced(kind, var)
            dispatch.gemm_config = pick
            ops._prepared = type(ops._prepared)()
            try:
                out = ops.experts(x, ids, wts, ew, 10.0).float()
                ms = graph_ms(lambda i: ops.experts(x, routes[i][1], routes[i][0], ew, 10.0), ROUTINGS)
            finally:
                dispatch.gemm_config = orig
            ref = out if ref is None else ref
            record(section="decode", op="fp4 experts 256x(2048x4096)x3 top-6", rows=t, experts=touched, kernel=kind,
                   variant=var, rel_err=rel_err(out, ref), against=against, us=ms * 1e3,
                   pct_copy_bw=100 * touched * per_expert / (ms * 1e-3) / ceil["bw"])  # fmt: skip


def with_settings(s, fn):
    """``fn()`` with ``s`` the active ``cuda_sm100`` settings, then the ones before."""
    before = settings.active()
    settings.use(s)
    try:
        return fn()
    finally:
        settings.use(before)


def triton_only(fn):
    """``fn()`` with the TileLang FP8 GEMM and the dequantised weight on cuBLAS switched off (``ops.linear`` would
    pick them at prefill sizes)."""
    return with_settings(settings.active().model_copy(update={"tilelang": False, "dequant_gemm_rows": 0}), fn)


#: tensor-core tiles tried on the prefill's FP8 linears (as PREFILL_EXPERT_VARIANTS)
PREFILL_DENSE_VARIANTS = [(128, 128, 128, 8, 3), (128, 128, 64, 8, 3, True), (128, 256, 64, 8, 3, True),
                          (128, 128, 128, 8, 3, True), (64, 256, 128, 8, 3, True), (128, 256, 128, 8, 3, True)]  # fmt: skip


def with_tiles(variant, fn):
    """``fn()`` with every grouped GEMM on the tensor cores at tile ``variant``."""
    orig, pick = forced("tensor_cores", variant)
    dispatch.gemm_config = pick
    try:
        return fn()
    finally:
        dispatch.gemm_config = orig


#: rows at which prefill_dense times the FP8 linears on the Triton kernel and on the dequantised weight
DEQUANT_SWEEP_ROWS = [128, 256, 512, 1024, 2048]


def prefill_dense(ceil) -> None:
    try:
        from deepinfer_cuda_sm100.kernels import tl_fp8_gemm
    except ImportError as e:
        tl_fp8_gemm = None
        print(f"tilelang: not installed ({e})", flush=True)
    ops = CudaDenseOps()
    shapes = {
        "wq_b 32768x1024": (32768, 1024),
        "wo_b 4096x8192": (4096, 8192),
        "wq_a 1024x4096": (1024, 4096),
    }
    for M in (
        DEQUANT_SWEEP_ROWS
    ):  # where the dequantised weight on cuBLAS starts to win (settings.dequant_gemm_rows)
        for name, (n, k) in shapes.items():
            w = fp8(n, k)
            x = torch.randn(M, k, device=DEV, generator=G).to(torch.bfloat16)
            forced_on = settings.active().model_copy(update={"dequant_gemm_rows": 1})
            for kernel, fn in {"triton": lambda: triton_only(lambda: ops.linear(x, w)),
                               "dequant_cublas": lambda: with_settings(forced_on, lambda: ops.linear(x, w))}.items():  # fmt: skip
                ms = triton.testing.do_bench(fn, return_mode="median")
                record(section="prefill", op=f"fp8 linear {name}", rows=M, kernel=kernel, us=ms * 1e3,
                       pct_matmul=100 * 2 * M * n * k / (ms * 1e-3) / ceil["flops"])  # fmt: skip
    M = 8192
    for name, (n, k) in shapes.items():
        w = fp8(n, k)
        wd = dequantize(w, torch.bfloat16)
        x = torch.randn(M, k, device=DEV, generator=G).to(torch.bfloat16)
        ref = (x.float() @ wd.float().T) if n * M <= 1 << 28 else None
        flops = 2 * M * n * k
        runs = {
            "dispatched": lambda: ops.linear(x, w),
            "triton": lambda: triton_only(lambda: ops.linear(x, w)),
            "cublas_bf16_predequantised": lambda: x @ wd.T,
        }
        for v in PREFILL_DENSE_VARIANTS:
            runs[f"triton{list(v)}"] = lambda v=v: with_tiles(
                v, lambda: triton_only(lambda: ops.linear(x, w))
            )
        if tl_fp8_gemm is not None:  # (block_m, stages, threads, block_k)
            out = torch.empty(M, n, device=DEV, dtype=torch.bfloat16)
            for v in [
                (),
                (128, 2, 256, 128),
                (256, 2, 256, 64),
            ]:  # the default (256, 3, 256, 64), and v6's first
                runs[f"tilelang{list(v) if v else ''}"] = lambda v=v: tl_fp8_gemm.fp8_block_gemm(
                    x, w.data, w.scale, out, v
                )
        for kernel, fn in runs.items():
            t0 = time.perf_counter()
            got = fn()
            got = out if got is None else got
            first_s = time.perf_counter() - t0
            err = None if ref is None else rel_err(got.float(), ref)
            ms = triton.testing.do_bench(fn, return_mode="median")
            record(section="prefill", op=f"fp8 linear {name}", rows=M, kernel=kernel, rel_err=err, us=ms * 1e3,
                   tflops=flops / (ms * 1e-3) / 1e12, pct_matmul=100 * flops / (ms * 1e-3) / ceil["flops"],
                   first_call_s=first_s)  # fmt: skip


#: tensor-core tiles tried on the prefill's experts (block_m, block_n, block_k, num_warps, num_stages)
PREFILL_EXPERT_VARIANTS = [(128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (64, 128, 64, 4, 4),
                           # the weight tile as the MMA's left operand (swap_ab; v40)
                           (64, 128, 64, 4, 4, True), (128, 128, 64, 8, 3, True), (64, 128, 128, 4, 3, True),
                           (128, 128, 128, 8, 3, True), (64, 256, 64, 8, 3, True), (128, 256, 64, 8, 3, True),
                           (32, 128, 128, 4, 4, True), (64, 128, 64, 8, 4, True), (64, 64, 128, 4, 4, True),
                           # one row tile an expert at 192 rows on average: each weight tile decoded once
                           (256, 128, 64, 8, 3, True), (256, 64, 64, 8, 3, True), (256, 64, 128, 8, 2, True),
                           # around the 128-deep K step (v42)
                           (128, 128, 128, 8, 4), (64, 128, 128, 4, 4), (64, 128, 128, 8, 3), (128, 64, 128, 4, 3),
                           (128, 128, 256, 8, 2), (128, 256, 128, 8, 3),
                           # one row tile an expert unswapped: each weight tile decoded once for up to 256 rows
                           (256, 64, 64, 8, 3), (256, 64, 128, 8, 2), (256, 128, 64, 8, 2),
                           # fewer registers a thread (ptxas: the 128-deep tile spills 1.8 KB at 8 warps)
                           (128, 128, 128, 16, 3), (128, 64, 128, 8, 3)]  # fmt: skip


def prefill_experts(ceil) -> None:
    """The FP4 routed experts of an 8,192-token prefill (256 x 2048 x 4096, top-6: 192 rows an expert on
    average): the dispatched tile, each tile of ``PREFILL_EXPERT_VARIANTS`` and Triton's bit placement,
    against the first; and, as a peer, torch's grouped bf16 GEMM (``torch._grouped_mm``) on weights
    dequantised beforehand (gate, up and down; routing, activation and sums left out)."""
    ops = CudaMoEOps()
    E, INTER, H, K, T = 256, 2048, 4096, 6, 8192
    ew = ExpertWeights([fp4(INTER, H) for _ in range(E)], [fp4(INTER, H) for _ in range(E)],
                       [fp4(H, INTER) for _ in range(E)], list(range(E)))  # fmt: skip
    flops = 2 * T * K * 3 * INTER * H
    x = torch.randn(T, H, device=DEV, generator=G).to(torch.bfloat16)
    wts, ids = ops.route_topk(torch.randn(T, E, device=DEV, generator=G), torch.zeros(E, device=DEV), K,
                              "sqrtsoftplus", 1.5)  # fmt: skip
    ref = None
    for kind, var in [("tensor_cores", None), ("tensor_cores_bits", None)] + [
        ("tensor_cores", v) for v in PREFILL_EXPERT_VARIANTS
    ]:
        orig, pick = forced(kind, var)
        dispatch.gemm_config = pick
        ops._prepared = type(ops._prepared)()
        try:
            out = ops.experts(x, ids, wts, ew, 10.0).float()
            ms = triton.testing.do_bench(lambda: ops.experts(x, ids, wts, ew, 10.0), return_mode="median")
        except Exception as e:  # noqa: BLE001 - a tile that does not fit (shared memory) is reported
            record(
                section="prefill",
                op="fp4 experts",
                kernel=kind,
                variant=var,
                error=f"{type(e).__name__}: {e}"[:200],
            )
            continue
        finally:
            dispatch.gemm_config = orig
        ref = out if ref is None else ref
        record(section="prefill", op="fp4 experts 256x(2048x4096)x3 top-6", rows=T, kernel=kind, variant=var,
               rel_err=rel_err(out, ref), us=ms * 1e3, tflops=flops / (ms * 1e-3) / 1e12,
               pct_matmul=100 * flops / (ms * 1e-3) / ceil["flops"])  # fmt: skip
    from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

    for proj, ws in (("w1", ew.w1), ("w2", ew.w2)):  # what dequantising the experts for a library GEMM costs
        table = gg.WeightTable.build(ws, x.device)
        buf = torch.empty((E, table.n, table.k), dtype=torch.bfloat16, device=DEV)
        ms = triton.testing.do_bench(
            lambda t=table, b=buf: gg.dequantize(t, torch.bfloat16, out=b), return_mode="median"
        )
        record(section="prefill", op=f"dequantize 256 experts {proj}", kernel="gg.dequantize", us=ms * 1e3,
               pct_copy=100 * (buf.numel() * 2.5) / (ms * 1e-3) / ceil["bw"])  # fmt: skip
        del buf
    if not hasattr(torch, "_grouped_mm"):
        return
    order = ids.flatten().argsort()
    counts = torch.bincount(ids.flatten(), minlength=E)
    offs = counts.cumsum(0).to(torch.int32)
    xs = x[order // K]
    w13 = torch.stack([torch.cat([dequantize(a, torch.bfloat16), dequantize(b, torch.bfloat16)]).T
                       for a, b in zip(ew.w1, ew.w3, strict=True)])  # fmt: skip  # [E, H, 2 * INTER]
    w2 = torch.stack([dequantize(w, torch.bfloat16).T for w in ew.w2])  # [E, INTER, H]

    def peer():
        h = torch._grouped_mm(xs, w13, offs=offs)
        return torch._grouped_mm(h[:, :INTER].contiguous(), w2, offs=offs)

    try:
        peer()
        ms = triton.testing.do_bench(peer, return_mode="median")
    except Exception as e:  # noqa: BLE001 - the peer's layout rules differ between torch builds
        record(
            section="prefill",
            op="fp4 experts",
            kernel="torch_grouped_mm",
            error=f"{type(e).__name__}: {e}"[:300],
        )
        return
    record(section="prefill", op="fp4 experts 256x(2048x4096)x3 top-6", rows=T, kernel="torch_grouped_mm_bf16_predequantised",
           us=ms * 1e3, tflops=flops / (ms * 1e-3) / 1e12, pct_matmul=100 * flops / (ms * 1e-3) / ceil["flops"])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sections", nargs="*", default=["decode_dense", "decode_experts", "prefill_dense"])
    ap.add_argument(
        "--rows", type=int, nargs="*", default=DECODE_ROWS, help="decode rows (e.g. 1 for batch 1)"
    )
    args = ap.parse_args()
    DECODE_ROWS[:] = args.rows
    print({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__,
           "cuda_sm100": use_env_settings().model_dump()}, flush=True)  # fmt: skip
    ceil = ceilings()
    for s in args.sections:
        t0 = time.perf_counter()
        globals()[s](ceil)
        print(f"section {s}: {time.perf_counter() - t0:.1f} s", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gemm_kernels.json").write_text(json.dumps({"ceilings": ceil, "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
