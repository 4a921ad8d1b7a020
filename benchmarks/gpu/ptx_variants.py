"""Whether two compiled variants of a kernel do the same arithmetic: each mHC kernel launch of the manifest (V4's
recorded on the H200, V4.1's single-pass and site-entry launches recorded under the interpreter)
(``tests/plugins/cuda_sm100/launches_h200.json``), compiled for ``sm_90`` with ``PDL`` on and off, on the CPU
(``triton.compile`` needs no GPU), and the sequences of floating-point and conversion instructions of the two
PTX texts compared.

    TRITON_DEFAULT_FP_FUSION=1 python benchmarks/gpu/ptx_variants.py
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "plugins/deepinfer_cuda_sm100")]  # fmt: skip

from tests.plugins.cuda_sm100 import launch_manifest as lm  # noqa: E402

KERNELS = ("_hc_boundary_mix_kernel", "_hc_post_kernel", "_hc_collapse_norm_kernel", "_hc_mixes_kernel",
           "_hc_coeffs_kernel")  # fmt: skip
ARITH = re.compile(r"^(fma|mul|add|sub|div|rcp|sqrt|ex2|lg2|cvt|max|min|neg|abs|shfl)\.")


def arithmetic(ptx: str) -> list[str]:
    return [line.split()[0] for line in map(str.strip, ptx.splitlines()) if ARITH.match(line)]


def main() -> None:
    seen = set()
    for entry in lm.load_manifest():
        if entry["kernel"] not in KERNELS or "PDL" not in entry["constexprs"]:
            continue
        key = (
            entry["kernel"],
            repr(sorted(entry["constexprs"].items())),
            tuple(entry["signature"].values())[:2],
        )
        if key in seen:
            continue
        seen.add(key)
        on, off = copy.deepcopy(entry), copy.deepcopy(entry)
        on["constexprs"]["PDL"], off["constexprs"]["PDL"] = True, False
        on_ops, off_ops = (arithmetic(lm.compile_entry(e, cc=90).asm["ptx"]) for e in (on, off))
        shapes = {k: v for k, v in entry["constexprs"].items() if k != "PDL"}
        first = next(iter(entry["signature"].values()))
        print(f"{entry['kernel']} {shapes} {first}: {len(on_ops)} instructions, the same with PDL off: "
              f"{on_ops == off_ops}")  # fmt: skip


if __name__ == "__main__":
    main()
