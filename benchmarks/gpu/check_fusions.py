"""Rows of ``check.py``'s dense section for the plugin's fused steps: a sublayer boundary's mHC in two launches
(``hc_pre_norm``, ``hc_post_pre``) and V4.1's site entry with its coefficients on a side stream, the MoE's shared
expert with the routed output added in its epilogue (``swiglu_mlp_add``, plugin API 2.7) and V4.1's Engram gate;
and the section ``plan``: ``device_plan``'s static plan (plugin API 2.14)."""

# ruff: noqa: B023 - every lambda here is called before its loop variables change
from __future__ import annotations

from check_common import (
    BOUND,
    DEV,
    F32,
    HC,
    HIDDEN,
    INTER,
    SMOKE,
    G,
    bench,
    bench_graph,
    poisoned,
    record,
    rel_err,
    rnd,
    sizes,
    torch,
)

from deepinfer_core.ops.compose import compose_hc_post_pre, compose_hc_pre_norm
from deepinfer_core.ops.dense import engram_gate_rows
from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.reference import reference_op
from deepinfer_cuda_sm100 import dispatch, settings

REPEATS = 200 if not SMOKE else 3  # calls of a last-arriver kernel compared bitwise


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


def check_hc_fused(ops, fn, base, scale):
    """A sublayer boundary's mHC as decode runs it (one and two tokens, in a graph): ``hc_pre_norm`` and
    ``hc_post_pre`` in two launches (``mhc_boundary._hc_boundary_mix_kernel``, ``_hc_collapse_norm_kernel``)
    against the reference, against the four launches they replace (timed side by side), and against
    themselves over ``REPEATS`` calls, bitwise. Then launch shapes."""
    from deepinfer_cuda_sm100.kernels import mhc_boundary

    ref = reference_op("dense")
    w = rnd(HIDDEN, dtype=F32).abs() + 0.5
    mix = (fn, base, scale, 20, 1e-6, 1e-6)
    hc = HCParams(*mix)
    fused_cfg = dispatch.hc_fused_config
    for T in (1, 2):
        x, y = rnd(T, HC, HIDDEN), rnd(T, HIDDEN)
        _, post, comb = ops.hc_pre(x, hc)
        cases = {
            "hc_pre_norm": (lambda: ops.hc_pre_norm(x, hc, w), lambda: compose_hc_pre_norm(ref, x, hc, w),
                            lambda: ops.rms_norm(ops.hc_pre(x, hc)[0], w, 1e-6), 2 * x.numel()),
            "hc_post_pre": (lambda: ops.hc_post_pre(y, x, post, comb, hc, w),
                            lambda: compose_hc_post_pre(ref, y, x, post, comb, hc, w),
                            lambda: ops.rms_norm(ops.hc_pre(ops.hc_post(y, x, post, comb), hc)[0], w, 1e-6),
                            4 * x.numel() + 2 * y.numel()),
        }  # fmt: skip
        for name, (fused, reference, separate, act_bytes) in cases.items():
            assert fused_cfg(T, HC, HIDDEN, fn.shape[0]) is not None, "the fused launches are off"
            outs = poisoned(fused)
            err = max(rel_err(a, b) for a, b in zip(outs, reference()))
            first = [o.clone() for o in outs]
            same = sum(all(torch.equal(a, b) for a, b in zip(fused(), first)) for _ in range(REPEATS))
            by = act_bytes + 2 * T * HIDDEN + 4 * fn.numel()
            record(f"{name}[graph]", f"{T}x{HC}x{HIDDEN} two launches", err if same == REPEATS else float("inf"),
                   BOUND["bf16"], bench_graph(fused), by, note=f"{same}/{REPEATS} equal")  # fmt: skip
            dispatch.hc_fused_config = lambda *a: None
            try:
                record(f"  {name}[graph] separate launches", f"{T}x{HC}x{HIDDEN}", None, None,
                       bench_graph(separate), by)  # fmt: skip
            finally:
                dispatch.hc_fused_config = fused_cfg
            # what the Sinkhorn's 20 dependent iterations cost the launch pair (one iteration instead)
            one = HCParams(fn, base, scale, 1, 1e-6, 1e-6)
            sink = {"hc_pre_norm": lambda: ops.hc_pre_norm(x, one, w),
                    "hc_post_pre": lambda: ops.hc_post_pre(y, x, post, comb, one, w)}[name]  # fmt: skip
            record(
                f"  {name}[graph] one Sinkhorn iteration",
                f"{T}x{HC}x{HIDDEN}",
                None,
                None,
                bench_graph(sink),
                by,
            )
    x = rnd(1, HC, HIDDEN)
    want = ops.hc_pre_norm(x, hc, w)
    default = fused_cfg(1, HC, HIDDEN, fn.shape[0])
    for shape in ((32, 4, 128, 1), (16, 4, 128, 1), (64, 4, 128, 1), (32, 4, 256, 1), (32, 2, 128, 1)):
        cfg = dispatch.HcFusedConfig(*shape) if not SMOKE else default
        dispatch.hc_fused_config = lambda *a: cfg
        try:
            outs = poisoned(lambda: mhc_boundary.hc_pre_norm(x, *mix, w))
            err = max(rel_err(a, b) for a, b in zip(outs, want))
            ms = bench_graph(lambda: mhc_boundary.hc_pre_norm(x, *mix, w))
        finally:
            dispatch.hc_fused_config = fused_cfg
        record("hc_pre_norm[graph]", f"1x{HC}x{HIDDEN} {shape[0]} ch x {shape[1]}w, then {shape[2]} ch x {shape[3]}w",
               err, BOUND["bf16"], ms, 2 * x.numel() + 2 * HIDDEN + 4 * fn.numel(),
               note="default" if cfg == default else "")  # fmt: skip


def check_v41_side_coeffs(ops, fn, base, scale):
    """V4.1's site entry at one token (``hc_post_site_norm``: the collapse by the site before's ``pre``), graphed,
    followed by a stand-in sublayer (a bf16 ``HIDDEN x HIDDEN`` matmul of its output), with the site's own
    coefficients on a side stream (``settings.hc_side_coeffs``) against after the collapse on the current stream
    (the same kernel): the same bytes, and the time of entry + sublayer both ways (the branch overlaps the
    sublayer)."""
    w = rnd(HIDDEN, dtype=F32).abs() + 0.5
    hc = HCParams(fn, base, scale, 20, 1e-6, 1e-6)
    y, x = rnd(1, HIDDEN), rnd(1, HC, HIDDEN)
    _, post, comb = ops.hc_pre(x, hc)
    pre = torch.rand(1, HC, device=DEV, generator=G) + 0.25
    sub = rnd(HIDDEN, HIDDEN, scale=HIDDEN**-0.5)

    from deepinfer_cuda_sm100.kernels import side_branch

    def step():
        outs = ops.hc_post_site_norm(y, x, post, comb, hc, pre, w)
        out = outs[1] @ sub
        side_branch.join(DEV)  # what the step's next mHC op does (a capture must end joined)
        return (*outs, out)

    active = settings.active()
    got = {}
    for side in (False, True, False, True):
        settings.use(active.model_copy(update={"hc_side_coeffs": side}))
        try:
            outs = [o.clone() for o in poisoned(step)]
            same = all(torch.equal(a, b) for a, b in zip(outs, got.setdefault(False, outs)))
            record(f"v41 site entry + sublayer[graph], coefficients {'on a side stream' if side else 'in line'}",
                   f"1x{HC}x{HIDDEN}", 0.0 if same else float("inf"), BOUND["f32"], bench_graph(step),
                   4 * x.numel() + 2 * y.numel() + 2 * sub.numel())  # fmt: skip
        finally:
            settings.use(active)


def check_plan() -> None:
    """``device_plan``'s static plan (``kernels.static_plan``, three launches) against the core's composition of
    torch ops (``compose_static_plan``), exactly, at V4-Flash's shapes (window 128, ratios 4 overlapped and 128,
    block size 128, a 4k bucket; random positions and block ids, padding rows, a released block); both timed
    replayed in a CUDA graph (the decode graph's cost of the plan)."""
    from deepinfer_core.ops.compose import compose_static_plan
    from deepinfer_cuda_sm100.kernels.static_plan import static_plan

    bs, bucket, kinds = 128, 4096, ((4, True), (128, False))
    for T in sizes(1, 16, 256):
        pos = torch.randint(0, bucket - 1, (T,), generator=G, device=DEV)
        pos[T // 2 :: 7] = -1  # padding rows
        tables = [torch.randperm(4 * T * bucket // bs, device=DEV, generator=G)[: T * bucket // bs].view(T, -1)
                  for _ in range(2)]  # fmt: skip
        tables[1][0, 0] = -1  # released
        args = (pos, tables[0], tables[1], 1, 128, kinds, bucket, bs)
        flat = lambda out: [out[0], out[1], out[2], *(x for k in out[3] for x in k)]  # noqa: E731
        got, want = flat(poisoned(lambda: static_plan(*args))), flat(compose_static_plan(None, *args))
        bad = sum(int((a != b).sum()) for a, b in zip(got, want, strict=True))
        record(
            "static_plan",
            f"T={T}",
            float(bad),
            0.5,
            bench_graph(lambda: static_plan(*args)),
            note="err: differing slots",
        )
        record(
            "static_plan[composed]",
            f"T={T}",
            None,
            None,
            bench_graph(lambda: compose_static_plan(None, *args)),
        )
