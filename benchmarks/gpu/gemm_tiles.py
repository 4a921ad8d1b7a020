"""Overrides of ``dispatch.gemm_config`` for the GPU benchmarks: force a kernel, a launch variant or tiles.

Each returns the original function, to be put back by the caller; split-K is refitted to the new
tiles by ``dispatch.fit_split_k``, as ``gemm_config`` does for its own.
"""

from __future__ import annotations

import json
from dataclasses import replace

from deepinfer_cuda_sm100 import dispatch

#: the fields a tensor-core tile variant sets, in order
TILE_FIELDS = ("block_m", "block_n", "block_k", "num_warps", "num_stages")


def forced(kind: str, variant: tuple | None = None):
    """``(original, pick)``: ``pick`` always chooses ``kind`` ("tensor_cores", "tensor_cores_arith" for the
    integer FP4 decode, "tensor_cores_bits" for the Triton bit placement instead of the PTX decode, "swap" for
    the swap-AB kernel, or "gemv"), with a launch ``variant``: tile fields
    for the tensor cores and swap, ``(block_n, block_k, num_warps[, block_m])`` for the GEMV."""
    orig = dispatch.gemm_config

    def pick(rows, n, k, fmt, gated, active=None):
        cfg = orig(rows, n, k, fmt, gated, active)
        if kind.startswith("tensor_cores") or kind == "swap":
            if cfg.gemv:
                cfg = replace(orig(16, n, k, fmt, gated, None), split_k=cfg.split_k)
            if kind == "swap":
                cfg = replace(
                    cfg, swap=True, block_m=16, block_n=128, block_k=128 if fmt == "fp8_block" else 64
                )
            if variant is not None:
                cfg = replace(cfg, **dict(zip(TILE_FIELDS, variant)))
            cfg = dispatch.fit_split_k(cfg, n, k, active)
            return replace(
                cfg,
                fp4_bits=kind != "tensor_cores_arith",
                swap=kind == "swap",
                fp4_asm=cfg.fp4_asm and kind == "tensor_cores",
            )
        g = dispatch.gemv_config(min(rows, 8), fmt)
        if variant is not None:
            g = replace(g, block_n=variant[0], block_k=variant[1], num_warps=variant[2])
            g = replace(g, block_m=variant[3]) if len(variant) > 3 else g
        return dispatch.fit_split_k(g, n, k, active)

    return orig, pick


def force_fp4_tiles(spec: str) -> list[int]:
    """Install tensor-core tiles ``bm,bn,bk,warps,stages`` for the FP4 expert GEMMs of decode steps (not
    GEMVs), or ``best:PATH``: the fastest tensor-core variant at 256 rows in a ``gemm_kernels.py`` JSON.
    Returns the tiles (``[]``: nothing installed)."""
    if spec.startswith("best:"):
        with open(spec[5:]) as f:
            rows = json.load(f)["rows"]
        cands = [r for r in rows if r["op"].startswith("fp4 experts") and r["rows"] == 256]
        cands = [r for r in cands if r["kernel"] == "tensor_cores"]
        tiles = list(min(cands, key=lambda r: r["us"])["variant"] or [])
        if not tiles:
            return []
    else:
        tiles = [int(v) for v in spec.split(",")]
    orig = dispatch.gemm_config

    def pick(rows, n, k, fmt, gated, active=None):
        cfg = orig(rows, n, k, fmt, gated, active)
        if fmt != "fp4_e2m1" or cfg.gemv or rows > 64:  # decode steps only, not prefill
            return cfg
        return dispatch.fit_split_k(replace(cfg, **dict(zip(TILE_FIELDS, tiles))), n, k, active)

    dispatch.gemm_config = pick
    return tiles


def force_swap(spec: str) -> dict[str, list[int]]:
    """Install the swap-AB kernel for the decode-sized (at most 64 rows per expert, not GEMV) FP8 and FP4
    GEMMs: ``bm,bn,bk,warps,stages`` for both, or ``best:PATH``: per format, the fastest swap variant in a
    ``gemm_kernels.py`` JSON (FP4 experts at 256 rows, FP8 linears at 64), and only where it beat the
    tensor-core kernel there. Returns the tiles per format (``{}``: nothing installed)."""
    if spec.startswith("best:"):
        with open(spec[5:]) as f:
            rows = json.load(f)["rows"]
        tiles = {}
        for fmt, prefix, r in (("fp4_e2m1", "fp4 experts", 256), ("fp8_block", "fp8 linear", 64)):
            mine = [x for x in rows if x["op"].startswith(prefix) and x["rows"] == r]
            swaps = [x for x in mine if x["kernel"] == "swap"]
            tcs = [x for x in mine if x["kernel"] == "tensor_cores" and x["variant"] is None]
            if swaps and tcs and min(x["us"] for x in swaps) < min(x["us"] for x in tcs):
                tiles[fmt] = list(min(swaps, key=lambda x: x["us"])["variant"])
    else:
        t = [int(v) for v in spec.split(",")]
        tiles = {"fp4_e2m1": t, "fp8_block": t}
    if not tiles:
        return {}
    orig = dispatch.gemm_config

    def pick(rows, n, k, fmt, gated, active=None):
        cfg = orig(rows, n, k, fmt, gated, active)
        if fmt not in tiles or cfg.gemv or rows > 64:
            return cfg
        return dispatch.fit_split_k(
            replace(cfg, swap=True, **dict(zip(TILE_FIELDS, tiles[fmt]))), n, k, active
        )

    dispatch.gemm_config = pick
    return tiles
