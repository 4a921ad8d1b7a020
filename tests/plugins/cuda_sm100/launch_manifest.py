"""Which Triton kernels the CUDA plugin launches, with which compile-time arguments, and compiling them for SM100.

Two halves, both plain Python so they run on the H200 (Triton 3.6) and in CI (Triton 3.9, no GPU):

- :func:`record` patches Triton's launch entry (``JITFunction.run``, and ``InterpretedFunction.run`` under the
  interpreter) so each launch of a kernel of the plugin adds one entry: the kernel's module and name, the
  type of each runtime argument (tensor dtype, or scalar kind), the value of each ``tl.constexpr`` argument,
  and the launch options (warps, stages). ``benchmarks/gpu/record_launches.py`` runs it around the V4-Flash
  slice on the H200, so the entries are the shapes the dispatch tables really pick
  (``launches_h200.json`` beside this file).
- :func:`compile_entry` rebuilds a kernel's signature from an entry and compiles it with
  ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))``, which needs no GPU: Triton lowers to
  PTX and assembles it with the ``ptxas`` it bundles (``ptxas-blackwell`` for ``sm_100a``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path

import torch

PLUGIN_PREFIX = "deepinfer_cuda_sm100."
MANIFEST = Path(__file__).with_name("launches_h200.json")

_TL_DTYPE = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "i1",
}
for _name, _tl in (
    ("float8_e4m3fn", "fp8e4nv"),
    ("float8_e5m2", "fp8e5"),
    ("uint16", "u16"),
    ("uint32", "u32"),
):
    if hasattr(torch, _name):
        _TL_DTYPE[getattr(torch, _name)] = _tl


def _jit_of(obj):
    """The ``JITFunction`` under autotune / heuristics wrappers."""
    from triton.runtime import interpreter, jit

    while not isinstance(obj, (jit.JITFunction, interpreter.InterpretedFunction)):
        obj = obj.fn
    return obj


def _plain(value):
    """A constexpr value as JSON (Triton dtypes by name)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"repr": str(value)}


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TL_DTYPE[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    if value is None:
        return "none"
    if hasattr(value, "data_ptr"):  # a tensor-like wrapper Triton accepts (its dtype attribute)
        return "*" + _TL_DTYPE[value.dtype]
    raise TypeError(f"unrecorded argument type {type(value).__name__}")


def entry_of(fn, args: tuple, kwargs: dict) -> dict | None:
    """One launch as a manifest entry, or ``None`` for a kernel outside the plugin."""
    py = getattr(fn, "fn", fn)
    module = getattr(py, "__module__", "")
    if not module.startswith(PLUGIN_PREFIX):
        return None
    params = _params(fn)
    names = [p.name for p in params]
    bound = dict(zip(names, args))
    options = {}
    for k, v in kwargs.items():
        if k in names:
            bound[k] = v
        elif k in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            options[k] = v
    sig, const = {}, {}
    for p in params:
        if p.name not in bound:  # a default
            if p.is_constexpr and p.has_default:
                const[p.name] = _plain(p.default)
            continue
        v = bound[p.name]
        if p.is_constexpr:
            const[p.name] = _plain(v.value if hasattr(v, "value") and not isinstance(v, torch.Tensor) else v)
        else:
            sig[p.name] = _arg_type(v)
    return {
        "module": module,
        "kernel": py.__name__,
        "signature": sig,
        "constexprs": const,
        "options": options,
    }


class _Param:
    """The part of Triton's ``KernelParam`` used here, for an interpreted kernel (which has no ``params``)."""

    def __init__(self, param):
        self.name = param.name
        self.is_constexpr = "constexpr" in str(param.annotation)
        self.default = param.default
        self.has_default = param.default is not param.empty


def _params(fn):
    if hasattr(fn, "params"):
        return fn.params
    import inspect

    return [_Param(p) for p in inspect.signature(fn.fn).parameters.values()]


def _key(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True)


@contextlib.contextmanager
def record(into: dict):
    """Record every plugin kernel launch in the block into ``into`` (key -> entry, so repeats count once)."""
    from triton.runtime import interpreter, jit

    originals = [(cls, cls.run) for cls in (jit.JITFunction, interpreter.InterpretedFunction)]

    def wrap(orig):
        def run(self, *args, grid, warmup, **kwargs):
            try:
                e = entry_of(self, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - recording must never break a launch
                e = {"module": getattr(getattr(self, "fn", self), "__module__", "?"), "error": repr(exc)}
            if e is not None:
                into.setdefault(_key(e), e)
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    for cls, orig in originals:
        cls.run = wrap(orig)
    try:
        yield into
    finally:
        for cls, orig in originals:
            cls.run = orig


def load_manifest(path: Path = MANIFEST) -> list[dict]:
    return json.loads(path.read_text())["entries"]


def kernel_of(entry: dict):
    mod = importlib.import_module(entry["module"])
    return _jit_of(getattr(mod, entry["kernel"]))


def _constexpr_value(v):
    if isinstance(v, dict) and "repr" in v:
        import triton.language as tl

        return tl.dtype(v["repr"])  # a Triton dtype, recorded by name
    return v


def compile_entry(entry: dict, cc: int = 100, div16: tuple[str, ...] = ()):
    """Compile one manifest entry for ``sm_{cc}`` on this machine (no GPU needed); returns the compiled kernel.
    ``div16``: integer arguments known to be multiples of 16, as Triton specialises such values at launch (the
    manifest keeps types, not values; a row stride of 16 elements lets the loads along a row vectorise)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel_of(entry)
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[p.name] = _constexpr_value(entry["constexprs"].get(p.name, p.default))
            continue
        t = entry["signature"].get(p.name)
        if t in (None, "none"):  # None arguments are compile-time constants to Triton
            signature[p.name] = "constexpr"
            constexprs[p.name] = None
            continue
        signature[p.name] = t
        if (
            t.startswith("*") or p.name in div16
        ):  # torch allocations are 16-byte aligned, as Triton specialises
            # them at launch
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    opts = {
        k: v for k, v in entry["options"].items() if k in ("num_warps", "num_stages", "num_ctas", "maxnreg")
    }
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)


def launched_kernels() -> set[str]:
    """The plugin's kernels that some launcher launches (``name[grid](...)`` in the source), by name."""
    import re

    root = Path(importlib.import_module("deepinfer_cuda_sm100").__file__).parent
    names = set()
    for f in root.rglob("*.py"):
        names |= set(re.findall(r"\b(_\w+_kernel)\[", f.read_text()))
    return names


def ptx_summary(compiled) -> dict:
    """What the SM100 PTX of one compiled entry contains: its target and instruction families."""
    ptx = compiled.asm["ptx"]
    return {
        "target": next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), ""),
        "tcgen05": ptx.count("tcgen05.mma"),
        "block_scale": ptx.count("kind::mxf8f6f4.block_scale.block32"),
        "wgmma": ptx.count("wgmma.mma_async"),
        "mma_sync": ptx.count("mma.sync"),
        "griddepcontrol": ptx.count("griddepcontrol"),
        "cubin_bytes": len(compiled.asm.get("cubin", b"")),
    }


#: the kernels whose ``tl.dot`` runs on tensor cores, and the constexpr that is the dot's M tile
DOT_M_TILE = {
    "_grouped_gemm_kernel": "BLOCK_M",
    "_indexer_score_kernel": "BLOCK_C",
    "_sparse_attn_kernel": "BLOCK_H",
}


def mma_kind(entry: dict) -> str | None:
    """Which MMA Triton 3.9 emits for SM100 for a tensor-core kernel's launch: ``"tcgen05_mx"`` (tensor-memory MMA
    of MX operands with ue8m0 scales per 32, ``kind::mxf8f6f4.block_scale.block32``) for the MX GEMM's 128-row
    tiles, ``"tcgen05"`` (tensor-memory MMA) for BF16 operands on an M tile of at least 64 rows, ``"mma_sync"`` (the SM80 warp MMA) for smaller M tiles,
    and none for the float32 path (FMA). ``None`` for the other kernels. Learned from compiling the cover;
    ``test_sm100_compile`` holds every compiled entry to it."""
    if (
        entry["kernel"] == "_mx_gemm_kernel"
    ):  # MMA "mx": tl.dot_scaled, the block-scaled MX MMA at 128-row tiles;
        c = entry["constexprs"]  # "fp8" (SM90's path): an e4m3 tl.dot, tensor-memory kind::f8f6f4 on SM100
        return "tcgen05_mx" if c.get("MMA", "mx") == "mx" and c["BLOCK_M"] >= 128 else "tcgen05"
    tile = DOT_M_TILE.get(entry["kernel"])
    if tile is None:
        return None
    c = entry["constexprs"]
    if c.get("DOT_T") != {"repr": "bf16"}:
        return "none"
    return "tcgen05" if c[tile] >= 64 else "mma_sync"


#: integer constexprs that pick a code path rather than a tile size: the FP8 scale block (128, or V4.1's 32) and
#: the packed-KV formats of the attention's two pools, of the indexer's keys and of the packed store
CODE_PATH_INTS = ("SB", "KV_PACK", "CMP_PACK", "KEY_PACK", "PACK")


def cover(entries: list[dict]) -> list[dict]:
    """A small subset that still compiles every kernel, every value of each of its code-path constexprs (flags
    and dtypes; not tile sizes), every MMA kind its launches compile to (:func:`mma_kind`) and its largest
    dispatched tile: greedy set cover, deterministic."""

    def feats(e):
        out, mma = {(e["kernel"], "kernel")}, mma_kind(e)
        for k, v in e["constexprs"].items():
            if isinstance(v, bool) or not isinstance(v, int) or k in CODE_PATH_INTS:
                out.add((e["kernel"], k, json.dumps(v)))
                if (
                    mma is not None
                ):  # each code path with every MMA it compiles to (FMA, warp MMA, tensor memory)
                    out.add((e["kernel"], k, json.dumps(v), mma))
        return out

    def tile(e):
        n = 1
        for k, v in e["constexprs"].items():
            if k.startswith("BLOCK") and isinstance(v, int) and not isinstance(v, bool):
                n *= v
        return n * e["options"].get("num_stages", 1) * e["options"].get("num_warps", 4)

    ordered = sorted(entries, key=lambda e: json.dumps(e, sort_keys=True))
    chosen, need = [], set().union(*(feats(e) for e in ordered))
    for kernel in sorted({e["kernel"] for e in ordered}):  # each kernel's largest tile first
        chosen.append(max((e for e in ordered if e["kernel"] == kernel), key=tile))
    for e in chosen:
        need -= feats(e)
    while need:
        best = max(ordered, key=lambda e: len(feats(e) & need))
        chosen.append(best)
        need -= feats(best)
    return chosen


def _main(argv: list[str] | None = None) -> int:
    """``python launch_manifest.py [--all] [--cc 100] [--out F]``: compile the cover (or every entry) and print
    (or write) each entry's PTX summary. Run without ``TRITON_INTERPRET``."""
    import argparse
    import time

    ap = argparse.ArgumentParser()
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--cc", type=int, default=100)
    ap.add_argument("--out")
    ap.add_argument("--shard", default="0/1", help="i/n: compile every n-th entry from i (parallel runs)")
    args = ap.parse_args(argv)
    entries = load_manifest()
    chosen = entries if args.all else cover(entries)
    i, n = (int(x) for x in args.shard.split("/"))
    chosen = chosen[i::n]
    rows = []
    for e in chosen:
        t0 = time.perf_counter()
        try:
            row = {"entry": e, **ptx_summary(compile_entry(e, args.cc))}
        except Exception as exc:  # noqa: BLE001 - reported per entry
            row = {"entry": e, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
    text = json.dumps(rows, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(_main())
