"""Rows of ``check.py``'s dense section for the plugin's newer one-launch steps: the MoE's shared expert with the
routed output added in its epilogue (``swiglu_mlp_add``, plugin API 2.7) and V4.1's Engram gate."""

# ruff: noqa: B023 - every lambda here is called before its loop variables change
from __future__ import annotations

from check_common import BOUND, F32, HIDDEN, INTER, bench, poisoned, record, rel_err, rnd, sizes, torch

from deepinfer_core.ops.dense import engram_gate_rows


def check_dense_fusions(ops, ref, w1, w3, w2) -> None:
    """``w1, w3, w2``: an FP8-block shared expert on the device."""
    # bit for bit the MLP, then the add
    for T in sizes(1, 16):
        x, routed = rnd(T, HIDDEN), rnd(T, HIDDEN)
        out = poisoned(lambda: ops.swiglu_mlp_add(x, w1, w3, w2, 10.0, routed))
        same = torch.equal(out, ops.swiglu_mlp(x, w1, w3, w2, 10.0) + routed)
        record("swiglu_mlp_add[fp8]", f"{T}x{HIDDEN}, I={INTER}", 0.0 if same else float("inf"), BOUND["f32"],
               bench(lambda: ops.swiglu_mlp_add(x, w1, w3, w2, 10.0, routed)), 3 * HIDDEN * INTER + 6 * T * HIDDEN,
               6 * T * HIDDEN * INTER,
               note=f"swiglu_mlp + add {bench(lambda: ops.swiglu_mlp(x, w1, w3, w2, 10.0) + routed) * 1e3:.1f} us")  # fmt: skip
    # the Engram gate in one launch (4 streams), against the reference
    for T in sizes(1, 16):
        h, key, value = rnd(T, 4, HIDDEN), rnd(T, 4, HIDDEN), rnd(T, HIDDEN)
        weight = rnd(4, HIDDEN, dtype=F32)
        out = poisoned(lambda: ops.engram_gate(h, key, value, weight, 1e-20))
        want = ref.engram_gate(*(v.cpu() for v in (h, key, value, weight)), 1e-20)
        record("engram_gate", f"{T}x4x{HIDDEN}", rel_err(out, want), BOUND["bf16"],
               bench(lambda: ops.engram_gate(h, key, value, weight, 1e-20)), 2 * (9 * T * HIDDEN) + 4 * 4 * HIDDEN,
               note=f"torch rows {bench(lambda: engram_gate_rows(h, key, value, weight, 1e-20)) * 1e3:.1f} us")  # fmt: skip
