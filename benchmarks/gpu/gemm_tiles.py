"""Overrides of ``dispatch.gemm_config`` for the GPU benchmarks: force a kernel, a launch variant or tiles.

Each returns the original function, to be put back by the caller; split-K is refitted to the new
tiles by ``dispatch.fit_split_k``, as ``gemm_config`` does for its own.
"""

from __future__ import annotations

import json
from dataclasses import replace

from deepinfer_cuda_sm100 import dispatch

#: the fields a tensor-core tile variant sets, in order
TILE_FIELDS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "swap_ab")


def forced(kind: str, variant: tuple | None = None):
    """``(original, pick)``: ``pick`` always chooses ``kind`` ("tensor_cores", "tensor_cores_arith" for the
    integer FP4 decode, "tensor_cores_bits" for the Triton bit placement instead of the PTX decode, "gemv"
    (one-row FP4 in float16 pairs where dispatched), "gemv_f32" (float32 FMAs on the PTX decode) or "gemv_bits"
    (float32 FMAs on Triton's bit placement), "gemv_down" (the variant for the non-gated calls only: the
    experts' down projection)), with a launch ``variant``: tile fields for the tensor cores, ``(block_n, block_k, num_warps[,
    block_m[, num_stages]])`` for the GEMV."""
    orig = dispatch.gemm_config

    def pick(rows, n, k, fmt, gated, active=None):
        cfg = orig(rows, n, k, fmt, gated, active)
        if kind.startswith("tensor_cores"):
            if cfg.gemv:
                cfg = replace(orig(16, n, k, fmt, gated, None), split_k=cfg.split_k)
            if variant is not None:
                cfg = replace(cfg, **dict(zip(TILE_FIELDS, variant)))
            cfg = dispatch.fit_split_k(cfg, n, k, active)
            return replace(
                cfg,
                fp4_bits=kind != "tensor_cores_arith",
                fp4_asm=cfg.fp4_asm and kind == "tensor_cores",
            )
        base = (
            cfg if cfg.gemv else dispatch.gemv_config(min(rows, 8), fmt)
        )  # as dispatched where it is a GEMV
        g = replace(
            base, fp4_asm=kind in ("gemv", "gemv_down", "gemv_f32"), fp4_h2=kind in ("gemv", "gemv_down")
        )
        if variant is not None and (kind != "gemv_down" or not gated):
            g = replace(g, block_n=variant[0], block_k=variant[1], num_warps=variant[2])
            g = replace(g, block_m=variant[3]) if len(variant) > 3 else g
            g = replace(g, num_stages=variant[4]) if len(variant) > 4 else g
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


def force_prefill_tiles(spec: str) -> dict:
    """Install other tiles for prefill-sized launches (over 1,024 rows), for an A/B of the whole prefill.
    ``spec``: ``;``-separated ``mixes:old`` (mHC's mixes launch takes the 32-row, 128-deep tiles it had before
    RESULTS v42) and ``attn:bh,bn,warps,stages`` (the bf16 sparse-attention tile at more than 256 rows). Returns what
    was installed."""
    done = {}
    for part in filter(None, spec.split(";")):
        what, _, val = part.partition(":")
        if what == "mixes" and val == "old":
            real_mixes = dispatch.hc_mixes_config

            def mixes(t, k, m, real=real_mixes):
                return real(t, k, m) if t <= 1024 else dispatch.hc_mixes_tile(t, k, 32, 128, 4, 3)

            dispatch.hc_mixes_config = mixes
        elif what == "attn":
            tile = dispatch.AttentionConfig(*(int(v) for v in val.split(",")))
            real_attn = dispatch.attention_config

            def attn(t, h, d, n_slots, fp8=False, packed=False, real=real_attn, tile=tile):
                if t > 256 and d >= 256 and not (fp8 or packed):
                    return tile
                return real(t, h, d, n_slots, fp8, packed)

            dispatch.attention_config = attn
        else:
            raise ValueError(f"--prefill-tiles: unknown part {part!r} (mixes:old or attn:bh,bn,warps,stages)")
        done[what] = val
    return done
