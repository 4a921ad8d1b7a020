"""Which outputs of V4.1's fused site entry (``hc_post_site_norm``, one token, eager) change bits when the site's
own coefficients run on the side (``settings.hc_side_coeffs``), at V4.1-Flash's width (4 streams x 5120, bf16) and
at V4-Flash's (4 x 4096, what ``check.py`` compares): elements that differ and the largest difference, per output.
Then a chain of 16 site entries as a decode step runs them (the first and every fourth without an exit to fold, the
rest ``hc_post_site_norm``; a bf16 matmul of each entry's output as the sublayer between), eager, with the side
stream off / on and PDL on / off: the last entry's outputs of each against side off with PDL on. Then
``entries``: the same chain with side off, on, and on with the branch launched in place on the main stream
(``side_branch.fork`` as on a CPU: the same kernels, no second stream), each entry's outputs against side off's,
the first entry and output that differs (a race shows as on != inline; the kernels' own bits as inline != off).

    python3 benchmarks/gpu/side_coeffs_diff.py [main] [chain] [entries]
"""

from __future__ import annotations

import sys

import torch

from deepinfer_core.ops.mhc import HCParams
from deepinfer_cuda_sm100 import settings
from deepinfer_cuda_sm100.kernels import side_branch
from deepinfer_cuda_sm100.ops.dense import CudaDenseOps


def main() -> None:
    g = torch.Generator("cuda").manual_seed(0)
    ops = CudaDenseOps()
    names = ("h", "normed", "own pre", "post", "comb")
    for d in (5120, 4096):
        n = 4
        r = lambda *s, sc=1.0: torch.randn(*s, generator=g, device="cuda") * sc  # noqa: E731
        fn, base, scale = r((2 + n) * n, n * d, sc=0.02), r((2 + n) * n, sc=0.5), r(3).abs() + 0.5
        hc = HCParams(fn, base, scale, 20, 1e-6, 1e-6)
        for trial in range(4):
            y, res = r(1, d).bfloat16(), r(1, n, d).bfloat16()
            post, comb = (r(1, n).sigmoid() * 2), r(1, n, n).softmax(-1)
            pre, w = torch.rand(1, n, device="cuda", generator=g) + 0.25, r(d).abs() + 0.5
            outs = {}
            for side in (False, True):
                settings.use(settings.active().model_copy(update={"hc_side_coeffs": side}))
                outs[side] = [o.clone() for o in ops.hc_post_site_norm(y, res, post, comb, hc, pre, w)]
                torch.cuda.synchronize()
            settings.use(settings.CudaSM100Settings())
            diff = {
                k: (int((a != b).sum()), float((a.float() - b.float()).abs().max()))
                for k, a, b in zip(names, outs[False], outs[True], strict=True)
            }
            print(f"D={d} trial {trial}: (differing elements, largest difference) {diff}", flush=True)


def _chain_case(n: int = 4, d: int = 5120):
    """The chain's 16 sites, stand-in sublayers, norm weight and first token (seed 1)."""
    g = torch.Generator("cuda").manual_seed(1)
    r = lambda *s, sc=1.0: torch.randn(*s, generator=g, device="cuda") * sc  # noqa: E731
    sites = [HCParams(r((2 + n) * n, n * d, sc=0.02), r((2 + n) * n, sc=0.5), r(3).abs() + 0.5, 20, 1e-6, 1e-6)
             for _ in range(16)]  # fmt: skip
    subs = [r(d, d, sc=d**-0.5).bfloat16() for _ in range(16)]
    return sites, subs, r(d).abs() + 0.5, r(1, d).bfloat16()


def _chain_entries(ops, sites, subs, w, x0, n=4):
    """Each entry's ``(streams, normed, pre, post, comb)``, and the streams after the last sublayer's exit."""
    h = x0[:, None, :].expand(-1, n, -1).contiguous()
    pre = torch.zeros(1, n, device="cuda")
    pre[:, 0] = 1.0
    y = post = comb = None
    seen = []
    for i in range(len(sites)):
        if y is None or i % 4 == 0:
            if y is not None:
                h = ops.hc_post(y, h, post, comb)
            x, pre, post, comb = ops.hc_site_norm(h, sites[i], pre, w)
        else:
            h, x, pre, post, comb = ops.hc_post_site_norm(y, h, post, comb, sites[i], pre, w)
        y = x @ subs[i]
        side_branch.join(x.device)  # (read them only after the branch: what the next entry does first)
        seen.append([t.clone() for t in (h, x, pre, post, comb)])
    last = ops.hc_post(y, h, post, comb).clone()
    torch.cuda.synchronize()
    return seen, last


NAMES = ("streams", "normed", "pre", "post", "comb")


def chain() -> None:
    ops, case = CudaDenseOps(), _chain_case()
    outs = {}
    for side, pdl in ((False, True), (True, True), (False, False), (True, False)):
        settings.use(settings.active().model_copy(update={"hc_side_coeffs": side, "pdl": pdl}))
        try:
            seen, last = _chain_entries(ops, *case)
        finally:
            settings.use(settings.CudaSM100Settings())
        outs[side, pdl] = [last, *seen[-1][1:]]
    for key in ((True, True), (False, False), (True, False)):  # each against side off, PDL on (the defaults)
        diff = {k: (int((a != b).sum()), float((a.float() - b.float()).abs().max()))
                for k, a, b in zip(NAMES, outs[False, True], outs[key], strict=True)}  # fmt: skip
        print(f"chain of 16 entries, D=5120, side {key[0]}, PDL {key[1]}: {diff}", flush=True)


def entries() -> None:
    ops, case = CudaDenseOps(), _chain_case()
    fork = side_branch.fork
    runs = {}
    for arm in ("off", "side", "inline", "side again"):
        settings.use(settings.active().model_copy(update={"hc_side_coeffs": arm != "off"}))
        if arm == "inline":
            side_branch.fork = lambda device, launch, held: launch()
        try:
            runs[arm] = _chain_entries(ops, *case)[0]
        finally:
            side_branch.fork = fork
            settings.use(settings.CudaSM100Settings())
    for a, b in (("off", "side"), ("off", "inline"), ("side", "inline"), ("side", "side again")):
        first = next(((i, k, int((u != v).sum()), float((u.float() - v.float()).abs().max()))
                      for i, (ea, eb) in enumerate(zip(runs[a], runs[b], strict=True))
                      for k, u, v in zip(NAMES, ea, eb, strict=True) if not torch.equal(u, v)), None)  # fmt: skip
        print(f"entries {a} vs {b}: first difference (entry, output, elements, largest) {first}", flush=True)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["main", "chain", "entries"]
    for part in parts:
        {"main": main, "chain": chain, "entries": entries}[part]()
