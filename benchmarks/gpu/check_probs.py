"""The sampler's ``probs`` in ``check.py`` (``--only probs``): the sort-free Triton kernels (``kernels/probs.py``)
against the reference op at batch 1, 16, 64 and 256 over the real vocabulary, timed beside the torch sorts they
replace, eager and replayed from a CUDA graph (what a graphed engine step sees)."""

# ruff: noqa: B023 - every lambda here is called before its loop variables change
from __future__ import annotations

import functools

from check_common import (  # noqa: E402 - after check_common has set TRITON_INTERPRET for --smoke
    BOUND,
    DEV,
    F32,
    SMOKE,
    VOCAB,
    G,
    bench,
    bench_graph,
    record,
    rel_err,
    rnd,
    torch,
)

from deepinfer_core.ops.reference import reference_op  # noqa: E402
from deepinfer_core.ops.sampling import SamplingTensors  # noqa: E402
from deepinfer_cuda_sm100.kernels import probs as kp  # noqa: E402
from deepinfer_cuda_sm100.ops.sampling import _probs  # noqa: E402


def _rows(B: int, engine_like: bool) -> SamplingTensors:
    """The engine benchmark's rows (temperature 0.6, top-p 0.95), or mixed ones: top-p from 0.5 to 1, min-p up
    to 0.1, every fourth row greedy."""
    if engine_like:
        return SamplingTensors(torch.full((B,), 0.6, device=DEV), torch.zeros(B, dtype=torch.int64, device=DEV),
                               torch.full((B,), 0.95, device=DEV), torch.zeros(B, device=DEV), any_top_k=False,
                               any_min_p=False)  # fmt: skip
    temp = rnd(B, dtype=F32).abs() + 0.3
    temp[::4] = 0.0
    return SamplingTensors(temp, torch.zeros(B, dtype=torch.int64, device=DEV),
                           torch.rand(B, device=DEV, generator=G) * 0.5 + 0.5,
                           torch.rand(B, device=DEV, generator=G) * 0.1, any_top_k=False)  # fmt: skip


def _kept_agree(got, want, logits, prm) -> tuple[bool, int]:
    """Whether the kernels keep the reference's tokens, but where top-p's boundary falls within 1e-5 of a token
    (float32 mass summed in another order rounds differently there), and how many rows differ at all."""
    diff = (got > 0) != (want > 0)
    if not diff.any():
        return True, 0
    x = logits.double() / torch.where(prm.temperature > 0, prm.temperature, 1.0).double()[:, None]
    p = torch.softmax(x, dim=-1)
    order = torch.sort(-p, dim=-1, stable=True).indices
    sp = p.gather(1, order)
    before = torch.zeros_like(p).scatter_(1, order, torch.cumsum(sp, dim=-1) - sp)
    rows, cols = diff.nonzero(as_tuple=True)
    near = (before[rows, cols] - prm.top_p[rows].double()).abs() < 1e-5
    return bool(near.all()), int(diff.any(dim=1).sum())


def check_probs():
    ref = reference_op("sampling")
    V = VOCAB
    for B in (1, 16, 64, 256) if not SMOKE else (1, 3):
        for engine_like in (True, False):
            prm = _rows(B, engine_like)
            logits = rnd(B, V, dtype=F32, scale=3.0)
            args = (logits, prm.temperature, prm.top_k, prm.top_p, prm.min_p)
            radix = functools.partial(kp.probs, top_k_used=False, top_p_used=True)
            sorts = functools.partial(_probs, cuts=(False, True, prm.any_min_p))
            tag = "temp 0.6, top-p 0.95" if engine_like else "mixed rows"
            nb = B * V * 4 * 10
            # the default (3-bit digits, compaction in pass 0 inside the softmax kernel); pass 0 launched alone;
            # compaction at pass 3 (the default until v36); none; six 5-bit digits
            for dbits, compact, fuse in ((3, 0, True), (3, 0, False), (3, 3, True), (3, -1, True),
                                         (5, -1, True)):  # fmt: skip
                kp.DBITS_P, kp.COMPACT_P, kp.FUSE_PASS0 = dbits, compact, fuse
                got, want = radix(*args), ref.probs(logits, prm)
                ok, rows = _kept_agree(got, want, logits, prm)
                keep = got > 0
                err = rel_err(torch.where(keep, got, 0), torch.where(keep, want, 0)) if ok else float("inf")
                at = f" compact@{compact}" if compact >= 0 else ""
                name = f"probs radix {dbits}-bit{at}{'' if fuse else ' pass0 alone'} ({tag})"
                record(name, f"B={B} V={V}", err, BOUND["f32"], bench(lambda: radix(*args)), nb,
                       note=f"{rows} rows differ at the boundary")  # fmt: skip
                record(
                    "  graphed", f"B={B} V={V}", None, None, bench_graph(lambda: radix(*args), calls=5), nb
                )
            kp.DBITS_P, kp.COMPACT_P, kp.FUSE_PASS0 = 3, 0, True
            record("  torch sorts", f"B={B} V={V}", None, None, bench(lambda: sorts(*args)), nb)
            record(
                "  torch sorts graphed",
                f"B={B} V={V}",
                None,
                None,
                bench_graph(lambda: sorts(*args), calls=5),
                nb,
            )
