"""The one-row GEMVs of a V4.1-Flash decode layer on the GPU, each at its dispatched tiles and at launch variants.

At batch 1 the V4.1 slice spends ~1.6 of its 2.3-2.6 ms in ``_grouped_gemv_kernel`` at ~36% of the copy rate
(RESULTS v26, v30), against V4's ~80% on its own shapes (the tiles in ``dispatch.gemv_config`` were chosen on
V4's, NOTES v10). V4.1's differ: hidden 5,120, q LoRA 1,280, FP8 with 32 x 32 scale blocks, ``wo_a`` held
dequantised in bf16 (8 groups of 1,024 x 4,096, 67 MB a layer), 384 FP4 experts of 2,304. Each call is timed in a
CUDA graph cycling through 512 MB of distinct weights (``gemm_kernels.graph_ms``: cold in L2, as in a step), as %
of the copy rate measured in the same run, and checked against the dequantised matmul (the experts against the
reference op on the experts used).

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python benchmarks/gpu/gemv_v41.py [--out DIR]
"""

# ruff: noqa: B023 - every lambda is called before its loop variables change
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from gemm_kernels import ROTATE_BYTES, ROUTINGS, ceilings, fp4, graph_ms, nbytes, rel_err
from gemm_kernels import dequantize as dequantize_fp4
from gemm_tiles import forced

from deepinfer_core.ops.reference import reference_op
from deepinfer_core.ops.weights import ExpertWeights, QuantizedWeight
from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

DEV = torch.device("cuda")
G = torch.Generator(DEV).manual_seed(11)
ROWS: list[dict] = []
H, Q_LORA, HEADS, HEAD_DIM, O_LORA, O_GROUPS, E, INTER, IDX = (
    5120,
    1280,
    64,
    512,
    1024,
    8,
    384,
    2304,
    32 * 128,
)
#: (block_n, block_k, num_warps) tried beside the dispatched tiles
VARIANTS = [(8, 1024, 4), (16, 512, 4), (32, 512, 4), (32, 256, 4), (64, 256, 4), (16, 256, 4), (32, 512, 8),
            (64, 512, 8), (16, 1024, 4), (32, 256, 2), (64, 256, 8), (128, 256, 8)]  # fmt: skip


def fp8_32(n: int, k: int) -> QuantizedWeight:
    data = torch.randn(n, k, device=DEV, generator=G).to(torch.float8_e4m3fn)
    scale = torch.full((-(-n // 32), -(-k // 32)), 2.0**-6, device=DEV)
    return QuantizedWeight(data, scale, "fp8_block32", (n, k))


def dequantize(w, dtype):
    if isinstance(w, QuantizedWeight) and w.format == "fp8_block32":
        n, k = w.shape
        return (w.data.float() * w.scale.repeat_interleave(32, 0)[:n].repeat_interleave(32, 1)[:, :k]).to(
            dtype
        )
    return dequantize_fp4(w, dtype)


def _time(op, fmt, n, k, nb, fn, ref, note="", reset=None):
    """``fn(i)`` (the ``i``-th copy of the weights) at the dispatched tiles, then at each variant (its K step
    halved where it does not divide K, as ``dispatch.whole_k_steps`` does for the dispatched tiles)."""
    for var in (None, *VARIANTS):
        orig, forced_pick = forced("gemv", var)

        def pick(rows, n_, k_, fmt_, gated, active=None):
            cfg = forced_pick(rows, n_, k_, fmt_, gated, active)
            return dispatch.fit_split_k(dispatch.whole_k_steps(cfg, k_), n_, k_, active)

        dispatch.gemm_config = pick
        if reset is not None:
            reset()
        try:
            err = rel_err(fn(0).float(), ref)
            ms = graph_ms(fn, COPIES[0])
            cfg = pick(1, n, k, fmt, False, (1, 1))
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is a row, not the end
            err, ms, cfg = float("inf"), float("nan"), repr(e)[:120]
        finally:
            dispatch.gemm_config = orig
        record(op=op, variant=var, rel_err=err, us=ms * 1e3, pct_copy=100 * nb / (ms * 1e-3) / CEIL["bw"],
               cfg=str(cfg), note=note)  # fmt: skip


COPIES = [1]
CEIL: dict[str, float] = {}


def record(**row) -> None:
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def dense() -> None:
    ops = CudaDenseOps()
    for name, (n, k) in {"wq_a": (Q_LORA, H), "wq_b": (HEADS * HEAD_DIM, Q_LORA), "wkv": (HEAD_DIM, H),
                         "wo_b": (H, O_LORA * O_GROUPS), "indexer wq_b": (IDX, Q_LORA)}.items():  # fmt: skip
        ws = [fp8_32(n, k) for _ in range(-(-ROTATE_BYTES // (n * k)))]
        COPIES[0] = len(ws)
        x = torch.randn(1, k, device=DEV, generator=G).to(torch.bfloat16)
        ref = x.float() @ dequantize(ws[0], torch.float32).T
        _time(f"fp8_block32 {name} {n}x{k}", "fp8_block32", n, k, n * k + ws[0].scale.numel() * 4,
              lambda i: ops.linear(x, ws[i]), ref)  # fmt: skip


def wo_a() -> None:
    """The 8 dequantised bf16 groups of ``wo_a`` in one grouped GEMV (``dense.grouped_linear``)."""
    ops = CudaDenseOps()
    n, k = O_LORA, HEADS * HEAD_DIM // O_GROUPS
    sets = [[torch.randn(n, k, device=DEV, generator=G).to(torch.bfloat16) * 0.02 for _ in range(O_GROUPS)]
            for _ in range(-(-ROTATE_BYTES // (n * k * 2 * O_GROUPS)))]  # fmt: skip
    COPIES[0] = len(sets)
    x = torch.randn(1, O_GROUPS, k, device=DEV, generator=G).to(torch.bfloat16)
    ref = torch.einsum("tgk,gnk->tgn", x.float(), torch.stack(sets[0]).float())
    _time(f"plain wo_a {O_GROUPS}x{n}x{k}", "plain", n, k, n * k * 2 * O_GROUPS,
          lambda i: ops.grouped_linear(x, sets[i]), ref)  # fmt: skip


def shared() -> None:
    ops = CudaDenseOps()
    mlps = [
        (fp8_32(INTER, H), fp8_32(INTER, H), fp8_32(H, INTER))
        for _ in range(-(-ROTATE_BYTES // (3 * INTER * H)))
    ]
    COPIES[0] = len(mlps)
    x = torch.randn(1, H, device=DEV, generator=G).to(torch.bfloat16)
    d1, d3, d2 = (dequantize(w, torch.float32) for w in mlps[0])
    g, u = x.float() @ d1.T, x.float() @ d3.T
    ref = (torch.nn.functional.silu(g.clamp(max=10.0)) * u.clamp(-10.0, 10.0)).to(
        torch.bfloat16
    ).float() @ d2.T
    _time(f"fp8_block32 shared expert {INTER}x{H} swiglu+down", "fp8_block32", INTER, H,
          3 * (INTER * H + mlps[0][0].scale.numel() * 4), lambda i: ops.swiglu_mlp(x, *mlps[i], 10.0), ref)  # fmt: skip


def experts() -> None:
    ops = CudaMoEOps()
    ew = ExpertWeights([fp4(INTER, H) for _ in range(E)], [fp4(INTER, H) for _ in range(E)],
                       [fp4(H, INTER) for _ in range(E)], list(range(E)))  # fmt: skip
    x = torch.randn(1, H, device=DEV, generator=G).to(torch.bfloat16)
    bias = torch.zeros(E, device=DEV)
    routes = [ops.route_topk(torch.randn(1, E, device=DEV, generator=G), bias, 6, "sqrtsoftplus", 1.5)
              for _ in range(ROUTINGS)]  # fmt: skip
    wts, ids = routes[0]
    used = set(ids.flatten().tolist())
    sub = [
        [dequantize(w, torch.bfloat16) if i in used else None for i, w in enumerate(ws)]
        for ws in (ew.w1, ew.w3, ew.w2)
    ]
    ref = reference_op("moe").experts(x, ids, wts, ExpertWeights(*sub, ew.expert_ids), 10.0).float()
    COPIES[0] = ROUTINGS
    _time(f"fp4 experts {E}x({INTER}x{H})x3 top-6", "fp4_e2m1", INTER, H, 6 * 3 * nbytes(ew.w1[0]),
          lambda i: ops.experts(x, routes[i][1], routes[i][0], ew, 10.0), ref, note="the variant on every call",
          reset=lambda: setattr(ops, "_prepared", type(ops._prepared)()))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sections", nargs="*", default=["dense", "wo_a", "shared", "experts"])
    args = ap.parse_args()
    print({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": torch.cuda.get_device_name()}, flush=True)
    CEIL.update(ceilings())
    for s in args.sections:
        t0 = time.perf_counter()
        globals()[s]()
        print(f"section {s}: {time.perf_counter() - t0:.1f} s", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gemv_v41.json").write_text(json.dumps({"ceilings": CEIL, "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
