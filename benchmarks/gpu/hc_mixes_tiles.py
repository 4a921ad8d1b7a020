"""mHC's mixes launch (``kernels/mhc._hc_mixes_kernel``) at prefill sizes: each candidate ``(block_t, block_k,
num_warps, num_stages)`` against the dispatched one, every output checked against float64 products.

Why: in V4's 8k prefill the launch took about 0.56 ms a call, nine calls (``v39_h100_v4prefill_1.json``), for 268 MB
of activations (0.09 ms at the copy rate). Each 32-row tile re-reads the whole float32 ``fn`` (1.5 MB) from L2, twice
the activations' bytes at 8k rows; taller row tiles read it less often.

    python benchmarks/gpu/hc_mixes_tiles.py [--tokens 2048 8192] [--out DIR]     (the GPU; --smoke: the CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_common import F32, HC, HIDDEN, SMOKE, bench, rel_err, rnd  # noqa: E402

from deepinfer_cuda_sm100 import dispatch  # noqa: E402
from deepinfer_cuda_sm100.kernels import mhc  # noqa: E402

#: (block_t, block_k, num_warps, num_stages), tried beside the dispatched tile
TILES = [(32, 128, 4, 3), (64, 128, 4, 3), (64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2),
         (64, 128, 8, 3), (256, 64, 8, 2), (128, 32, 4, 4)]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tokens", type=int, nargs="*", default=[2048, 8192])
    args = ap.parse_args()
    M = (2 + HC) * HC
    fn = rnd(M, HC * HIDDEN, dtype=F32, scale=0.02)
    real = dispatch.hc_mixes_config
    rows = []
    for T in args.tokens if not SMOKE else (19,):
        x = rnd(T, HC, HIDDEN)
        xd = x.reshape(T, -1).double()
        want_mix, want_sq = xd @ fn.double().T, (xd * xd).sum(1)
        tiles = [None] + [t for t in TILES if not SMOKE or t[0] <= 32]
        for tile in tiles:
            if tile is not None:
                bt, bk, w, st = tile if not SMOKE else (tile[0] // 2, 64, tile[2], 1)

                def pick(t, k, m, bt=bt, bk=bk, w=w, st=st):
                    return dispatch.hc_mixes_tile(t, k, bt, bk, w, st)

                dispatch.hc_mixes_config = pick
            try:
                cfg = dispatch.hc_mixes_config(T, HC * HIDDEN, M)
                part, sq = mhc.mixes_partials(x, fn)
                err = max(rel_err(part.sum(0), want_mix), rel_err(sq.sum(0), want_sq))
                us = bench(lambda x=x: mhc.mixes_partials(x, fn)) * 1e3
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is a finding
                err, us = None, None
                print(f"T={T} {tile}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            finally:
                dispatch.hc_mixes_config = real
            row = {"T": T, "tile": list(tile) if tile else "dispatched", "config": str(cfg), "rel_err": err, "us": us,
                   "pct_copy_x": 100 * 2 * x.numel() / (us * 1e-6) / 3.0e12 if us else None}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "hc_mixes_tiles.json").write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r["rel_err"] is not None and r["rel_err"] > 1e-5]
    if bad:
        raise SystemExit(f"{len(bad)} tiles differ from float64 products: {bad[:3]}")


if __name__ == "__main__":
    main()
