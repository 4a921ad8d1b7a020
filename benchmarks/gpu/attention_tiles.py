"""Sparse-attention decode tiles on the GPU: every candidate ``(block_h, block_n, num_warps, num_stages)`` over
the three pools the engine reads (V4's bf16 and FP8 rows, V4.1's packed FP8 window and FP4 compressed entries), at
decode sizes, replayed from a CUDA graph, each checked against the reference op.

Why: ``kernel_resources.py`` (ptxas, no GPU) finds every dispatched decode tile of ``_sparse_attn_kernel``
spilling at 255 registers (bf16 32 x 64 x 8 warps: 420 B; FP8 and V4.1's packed pools 32 x 32 x 8: 872 and 508 B),
and spill-free tiles beside them (bf16 32 x 32 x 8; FP8 and packed 16 x 16 x 8). This times them side by side; the
dispatch table changes only on what it shows.

    python benchmarks/gpu/attention_tiles.py [--out DIR]      (the GPU; --smoke: tiny sizes on the CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_common import BF16, DEV, F32, SMOKE, G, bench_graph, rel_err, rnd, torch  # noqa: E402

from deepinfer_core.models.deepseek_v41.kv_formats import compressed_kv, window_kv  # noqa: E402
from deepinfer_core.ops.kv_fp8 import Fp8KVFormat  # noqa: E402
from deepinfer_core.ops.reference import reference_op  # noqa: E402
from deepinfer_cuda_sm100 import dispatch  # noqa: E402
from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps  # noqa: E402

HEADS, HEAD_DIM, ROPE = (64, 512, 64) if not SMOKE else (4, 64, 16)
WINDOW, TOPK = (128, 512) if not SMOKE else (16, 24)
#: (block_h, block_n, num_warps, num_stages): the dispatched ones first, then the spill-free and smaller ones
TILES = [(32, 64, 8, 2), (32, 32, 8, 2), (16, 16, 8, 2), (16, 32, 8, 2), (16, 16, 4, 2), (32, 16, 8, 2),
         (16, 32, 4, 2), (16, 16, 8, 1), (64, 32, 8, 1), (32, 64, 8, 1), (64, 16, 8, 1), (64, 32, 8, 2)]  # fmt: skip


def pools(kind: str, S: int):
    """``(kv_pool, cmp_pool, kv_format, cmp_format, bytes per window row, per compressed row)`` of ``kind``."""
    kv, cmp = rnd(S, HEAD_DIM), rnd(S // 4, HEAD_DIM)
    if kind == "bf16":
        return kv, cmp, None, None, HEAD_DIM * 2, HEAD_DIM * 2
    if kind == "fp8":
        f = Fp8KVFormat(HEAD_DIM, ROPE, BF16)
        return f.pack(kv), f.pack(cmp), f, f, f.row_bytes, f.row_bytes
    w, c = window_kv(HEAD_DIM, BF16), compressed_kv(HEAD_DIM, BF16)
    return w.pack(kv), c.pack(cmp), w, c, w.row_bytes, c.row_bytes


def floor_splits(programs: int, n_slots: int, block_n: int) -> int:
    """:func:`dispatch.attention_splits` with the chunks rounded down (whole waves: ``SMs // programs``)."""
    if 2 * programs > dispatch.num_sms():
        return 1
    return max(1, min(-(-n_slots // block_n), dispatch.num_sms() // programs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument(
        "--tiles", nargs="*", default=[], help="bh,bn,warps,stages: only these tiles (default: all)"
    )
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 16, 64, 256])
    ap.add_argument(
        "--split-rules", nargs="+", default=["ceil"], choices=["ceil", "floor"],
        help="split-KV chunks: dispatch's cdiv(SMs, programs) (ceil) and/or SMs // programs (floor)",
    )  # fmt: skip
    ap.add_argument("--kinds", nargs="+", default=["bf16", "fp8", "v41"], choices=["bf16", "fp8", "v41"])
    ap.add_argument(
        "--pool", type=int, default=1 << 18,
        help="window rows in the pool the slots are drawn from (a quarter as many compressed): small pools stay in L2, "
        "as a prefill's do (8,192 tokens' window and compressed entries)",
    )  # fmt: skip
    args = ap.parse_args()
    tiles = [tuple(int(v) for v in t.split(",")) for t in args.tiles] or TILES
    ops, ref = CudaAttentionOps(), reference_op("attention")
    S = args.pool if not SMOKE else 256
    sinks = rnd(HEADS, dtype=F32)
    real, real_splits = dispatch.attention_config, dispatch.attention_splits
    rows = []
    for kind in args.kinds:
        kv, cmp, kf, cf, kb, cb = pools(kind, S)
        for T in args.tokens if not SMOKE else (1, 3):
            q = rnd(T, HEADS, HEAD_DIM)
            kv_slots = torch.randint(0, S, (T, WINDOW), device=DEV, generator=G)
            cmp_slots = torch.randint(0, S // 4, (T, TOPK), device=DEV, generator=G)
            a = (q, kv, kv_slots, cmp, cmp_slots, sinks, HEAD_DIM**-0.5)
            fmt = {"kv_format": kf, "cmp_format": cf}
            want = ref.sparse_attention(*a, **fmt)
            dispatched = real(T, HEADS, HEAD_DIM, WINDOW + TOPK, fp8=kind == "fp8", packed=kind == "v41")
            for (bh, bn, w, st), rule in ((t, r) for t in tiles for r in args.split_rules):
                tile = dispatch.AttentionConfig(bh, bn, w, st)
                dispatch.attention_config = lambda *x, tile=tile, **k: tile
                if rule == "floor":
                    dispatch.attention_splits = floor_splits
                splits = dispatch.attention_splits(T * -(-HEADS // bh), WINDOW + TOPK, bn)
                try:
                    err = rel_err(ops.sparse_attention(*a, **fmt), want)
                    us = bench_graph(lambda a=a, fmt=fmt: ops.sparse_attention(*a, **fmt)) * 1e3
                except Exception as e:  # noqa: BLE001 - a tile that does not fit is a finding
                    err, us = None, None
                    print(f"{kind} T={T} {tile}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                finally:
                    dispatch.attention_config, dispatch.attention_splits = real, real_splits
                row = {"pool": kind, "T": T, "tile": [bh, bn, w, st], "dispatched": replace(tile) == dispatched,
                       "split_rule": rule, "splits": splits, "rel_err": err, "us": us,
                       "bytes": T * (WINDOW * kb + TOPK * cb)}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "attention_tiles.json").write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r["rel_err"] is not None and r["rel_err"] > 1e-2]
    if bad:
        raise SystemExit(f"{len(bad)} tiles differ from the reference: {bad[:3]}")


if __name__ == "__main__":
    main()
