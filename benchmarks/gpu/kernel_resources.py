"""Registers, spills and shared memory of the plugin's kernels as ``ptxas`` assembles them, without a GPU.

Each launch recorded in the manifest (``tests/plugins/cuda_sm100/launches_h200.json``: the kernels and the
compile-time arguments the H200 runs) is compiled for ``sm_90a`` (or ``--cc 100``: ``sm_100a``) on this machine and
assembled again by the ``ptxas`` Triton bundles, with ``-v``: it reports what the register allocator did. A kernel
that spills (``spill stores`` above 0) keeps part of its tiles in local memory, which a GPU reads back through L1 at
every use: the first suspect of a kernel that runs far from its bandwidth or compute bound. ``--set NAME=VALUE``
overrides a constexpr or a launch option (``num_warps``, ``num_stages``) of every entry shown, to try tiles before
a device run. ``--sass N``: the N most frequent SASS instructions (opcode with its modifiers, by ``cuobjdump``) of
each, static counts over the whole kernel: how loads are vectorised (``LDG.E.128`` or byte by byte), how many
conversions (``F2F``, ``F2FP``, ``I2F``) and tensor-core instructions (``HGMMA``, ``HMMA``) it issues.

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python benchmarks/gpu/kernel_resources.py _sparse_attn_kernel \
        [--where BLOCK_D=512 --where DOT_T=bf16] [--set BLOCK_N=16 --set num_warps=4] [--cc 90]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "plugins" / "cuda_sm100"))

from launch_manifest import compile_entry, load_manifest  # noqa: E402

OPTIONS = ("num_warps", "num_stages", "maxnreg")


def _value(text: str):
    """A ``--where`` / ``--set`` value: an int, a bool, or a Triton dtype name (``bf16``, as the manifest has it)."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return {"repr": text}


def ptxas_usage(ptx: str, cc: int) -> dict:
    """``ptxas -v`` on ``ptx`` for ``sm_{cc}a``: registers, spill stores and loads (bytes), stack frame (bytes)."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        Path(src).write_text(ptx)
        run = subprocess.run(
            [str(ptxas), f"-arch=sm_{cc}a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
        )
    text = run.stdout + run.stderr
    if run.returncode:
        raise RuntimeError(f"ptxas failed: {text[-500:]}")

    def grab(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    return {
        "registers": grab(r"Used (\d+) registers"),
        "spill_stores": grab(r"(\d+) bytes spill stores"),
        "spill_loads": grab(r"(\d+) bytes spill loads"),
        "stack": grab(r"(\d+) bytes stack frame"),
    }


def sass_opcodes(cubin: bytes) -> dict[str, int]:
    """Static counts of each SASS opcode (with modifiers) in ``cubin``, by the ``cuobjdump`` Triton bundles."""
    import collections

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        Path(path).write_bytes(cubin)
        text = subprocess.run([str(tool), "-sass", path], capture_output=True, text=True, check=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
    return dict(collections.Counter(ops).most_common())


def usage(entry: dict, cc: int = 90, sass: bool = False, div16: tuple[str, ...] = ()) -> dict:
    """One entry compiled for ``sm_{cc}a``: ptxas's register report and Triton's shared memory (bytes);
    ``sass``: also the SASS opcode counts of the cubin Triton built."""
    compiled = compile_entry(entry, cc, div16)
    out = {**ptxas_usage(compiled.asm["ptx"], cc), "shared": compiled.metadata.shared}
    if sass:
        out["sass"] = sass_opcodes(compiled.asm["cubin"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel")
    ap.add_argument(
        "--where", action="append", default=[], help="NAME=VALUE: entries whose constexpr matches"
    )
    ap.add_argument(
        "--set", action="append", default=[], help="NAME=VALUE: override a constexpr or an option"
    )
    ap.add_argument("--cc", type=int, default=90)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--div16",
        action="append",
        default=[],
        help="NAME: an integer argument that is a multiple of 16 at launch (Triton specialises it)",
    )
    ap.add_argument("--sass", type=int, default=0, help="N: the N most frequent SASS opcodes of each")
    ap.add_argument(
        "--interpreter",
        action="store_true",
        help="also the entries recorded under the interpreter (CI's shapes)",
    )
    args = ap.parse_args()
    where = dict(w.split("=", 1) for w in args.where)
    sets = dict(s.split("=", 1) for s in args.set)
    seen, rows = set(), []
    for e in load_manifest():
        if e["kernel"] != args.kernel or (e.get("source") == "interpreter" and not args.interpreter):
            continue
        if any(e["constexprs"].get(k) != _value(v) for k, v in where.items()):
            continue
        e = json.loads(json.dumps(e))
        for k, v in sets.items():
            (e["options"] if k in OPTIONS else e["constexprs"])[k] = _value(v)
        key = json.dumps([e["constexprs"], e["options"], e["signature"]], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            {
                "constexprs": e["constexprs"],
                "options": e["options"],
                **usage(e, args.cc, args.sass > 0, tuple(args.div16)),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        c = {k: (v["repr"] if isinstance(v, dict) else v) for k, v in r["constexprs"].items()}
        print(
            f"regs {r['registers']:3d}  spill {r['spill_stores']:5d} B  smem {r['shared']:6d} B  "
            f"{r['options']}  {c}"
        )
        if args.sass:
            top = list(r["sass"].items())[: args.sass]
            print(f"    {sum(r['sass'].values())} instructions: " + ", ".join(f"{k} {v}" for k, v in top))


if __name__ == "__main__":
    main()
