"""Did a kernel edit change the code a GPU runs? Compile every distinct configuration of a kernel in the SM100
manifest (``tests/plugins/cuda_sm100/launches_h200.json``) for ``sm_90`` from two checkouts, on the CPU (no GPU),
and compare each PTX's instructions as a multiset, register numbers normalised, debug info left out. Equal
multisets: the same instructions, at most in another order. Prints one hash a configuration per checkout.

    python benchmarks/gpu/ptx_same_instructions.py OLD_CHECKOUT NEW_CHECKOUT [KERNEL] [--skip CONSTEXPR=VALUE]
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

KEYS = ("FP8", "KV_PACK", "CMP_PACK", "SPLIT", "BLOCK_H", "BLOCK_N", "DOT_T", "ROPE_Q", "Q_NORM", "PACKED_TILE",
        "HAS_CMP")  # fmt: skip
SKIP_LINES = ("//", ".file", ".loc", ".b8", ".b32", ".b64", ".section", "$L", "}", "{", ".debug")


def hashes(root: str, kernel: str, manifest: str, skip: dict) -> list[str]:
    sys.path[:0] = [root, f"{root}/plugins/deepinfer_cuda_sm100", f"{root}/tests/plugins/cuda_sm100"]
    import launch_manifest as lm

    seen, out = set(), []
    for e in json.loads(Path(manifest).read_text())["entries"]:
        c = e["constexprs"]
        if e["kernel"] != kernel or any(c.get(k) == v for k, v in skip.items()):
            continue
        key = json.dumps({k: c.get(k) for k in KEYS}, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        e = dict(e, constexprs={k: v for k, v in c.items() if k in {p.name for p in lm.kernel_of(e).params}})
        ptx = lm.compile_entry(e, cc=90).asm["ptx"]
        ins = sorted(re.sub(r"%[a-z]+\d+", "%R", line.split("//")[0]).strip() for line in ptx.splitlines()
                     if line.strip() and not line.strip().startswith(SKIP_LINES))  # fmt: skip
        out.append(hashlib.sha1("\n".join(ins).encode()).hexdigest()[:12])
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--skip")]
    skip = {}
    for a in sys.argv[1:]:
        if a.startswith("--skip"):
            k, v = a.split("=", 1)[1].split("=")
            skip[k] = int(v)
    old, new, kernel = args[0], args[1], args[2] if len(args) > 2 else "_sparse_attn_kernel"
    manifest = str(Path(new) / "tests/plugins/cuda_sm100/launches_h200.json")
    runs = []
    for root in (old, new):  # one process a checkout: the kernels' modules of one are imported
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import ptx_same_instructions as p; "
                f"print(' '.join(p.hashes({root!r}, {kernel!r}, {manifest!r}, {skip!r})))")  # fmt: skip
        runs.append(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout.split()
        )
    same = sum(a == b for a, b in zip(*runs, strict=True))
    print(f"{kernel}: {len(runs[0])} configurations; the same instructions in {same}")
    for a, b in zip(*runs, strict=True):
        print(a, b, "same" if a == b else "DIFFERENT")
