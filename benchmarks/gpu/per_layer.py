"""A layer's share of the roofline from ``v4_slice.py`` runs with two layer counts (the head taken out).

    python3 benchmarks/gpu/per_layer.py RUN_DIR/*/v4_slice.json

The difference between the slices' graphed steps over the difference of their layers is a layer's time; the
difference of their bytes over the copy rate measured in the same processes is its roofline. Pairs every
process of the smaller slice with every one of the larger, and prints the median and the range per batch.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys


def rows(paths: list[str]) -> dict[tuple[int, int], list[dict]]:
    """``(layers, batch) -> [decode rows]`` with each row's copy rate added."""
    out: dict[tuple[int, int], list[dict]] = {}
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        s = d.get("slice") or {}
        for r in s.get("decode", []):  # the copy rate the process measured, as its roofline used it
            copy = r["bytes"] / (r["roofline_ms"] * 1e-3)
            out.setdefault((s["layers"], r["batch"]), []).append({**r, "copy": copy})
    return out


def per_layer(small: list[dict], large: list[dict], n_small: int, n_large: int) -> list[dict]:
    res = []
    for a, b in itertools.product(small, large):
        dl = n_large - n_small
        ms = (b["graph_ms"] - a["graph_ms"]) / dl
        nbytes = (b["bytes"] - a["bytes"]) / dl
        roof = nbytes / ((a["copy"] + b["copy"]) / 2) * 1e3
        res.append({"layer_ms": ms, "layer_bytes": nbytes, "roofline_ms": roof, "share": 100 * roof / ms})
    return res


def main() -> None:
    by = rows(sys.argv[1:])
    layers = sorted({n for n, _ in by})
    if len(layers) < 2:
        sys.exit(f"need runs with two layer counts, got {layers}")
    lo, hi = layers[0], layers[-1]
    for batch in sorted({b for _, b in by}):
        if (lo, batch) not in by or (hi, batch) not in by:
            continue
        pairs = per_layer(by[(lo, batch)], by[(hi, batch)], lo, hi)
        sh = [p["share"] for p in pairs]
        ms = [p["layer_ms"] for p in pairs]
        print(json.dumps({
            "batch": batch, "layers": [lo, hi], "pairs": len(pairs),
            "graph_ms": {n: [round(r["graph_ms"], 4) for r in by[(n, batch)]] for n in (lo, hi)},
            "layer_ms_median": round(statistics.median(ms), 4), "layer_ms_range": [round(min(ms), 4), round(max(ms), 4)],
            "layer_bytes": pairs[0]["layer_bytes"], "layer_roofline_ms": round(pairs[0]["roofline_ms"], 4),
            "share_median": round(statistics.median(sh), 1), "share_range": [round(min(sh), 1), round(max(sh), 1)],
        }))  # fmt: skip


if __name__ == "__main__":
    main()
