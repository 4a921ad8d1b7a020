"""Write tiny DeepSeek-V4.1 checkpoints and DeepSeek's reference outputs on them, for the engine's tests.

    python tools/v41_goldens.py --reference .v41ref --out tests/data/v41

``--reference`` is a folder holding the release's ``inference/model.py`` and ``engram.py`` (checked by sha256),
the CPU kernel stand-in ``kernel_cpu.py`` and the two import stubs; see docs/v41_reference.md for how to set it
up. It is imported at run time; nothing of it is copied. ``--configs`` and ``--parts`` regenerate a subset (the
files written are byte-identical to a full run's). One CPU thread; a full run takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from v41golden import config_goldens, configs, measure, prompts, quantisers  # noqa: E402
from v41golden.files import COMMAND, provenance, sha256_file, write_json, write_tensors  # noqa: E402
from v41golden.reference import load_reference  # noqa: E402

PARTS = ("checkpoint", "prompts", "dspark", "engram", "quantisers")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--reference", type=Path, required=True, help="folder with model.py, engram.py, kernel_cpu.py"
    )
    ap.add_argument("--out", type=Path, default=Path("tests/data/v41"))
    ap.add_argument("--configs", nargs="*", default=[s.name for s in configs.SPECS])
    ap.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    ap.add_argument("--allow-other-reference", action="store_true", help="accept files with another sha256")
    ap.add_argument(
        "--measure",
        type=int,
        metavar="LEN",
        help="print the sensitivity and decode-fix measurements "
        "on a LEN-token prompt of each config instead of writing goldens",
    )
    ap.add_argument(
        "--floor",
        type=int,
        metavar="LEN",
        help="print the reference's 1e-6 sensitivity on each config's golden prompts of up to LEN tokens, "
        "pooled as the engine's aggregate test pools them, instead of writing goldens",
    )
    ap.add_argument("--floor-modes", nargs="*", default=["kvq_only"], help="modes for --floor")
    return ap.parse_args(argv)


def write_quantisers(ref, out: Path) -> Path:
    path = out / "quantisers.safetensors"
    prov = provenance(ref.sha256, COMMAND, {"input": 2024})
    write_tensors(path, quantisers.goldens(ref, quantisers.inputs(2024)), prov)
    return path


def write_manifest(ref, out: Path) -> None:
    """``manifest.json``: every file under ``out`` (but the manifest) with its size and sha256."""
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    entries = {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
    configs_covered = {s.name: s.covers for s in configs.SPECS if (out / s.name).is_dir()}
    write_json(
        out / "manifest.json",
        {"provenance": provenance(ref.sha256, COMMAND), "configs": configs_covered, "files": entries},
    )


def print_measurements(ref, names: list[str], length: int) -> None:
    for name in names:
        spec = configs.by_name(name)
        p = config_goldens.prepare(ref, spec)
        ids = prompts.random_prompt(spec, length, p.tok.get_vocab_size())
        result = {"sensitivity_1e-6": measure.sensitivity(ref, p, ids)}
        result.update(
            {f"decode_vs_prefill_{m}": measure.decode_vs_prefill(ref, p, ids, m) for m in ("exact", "kvq_on")}
        )
        print(json.dumps({name: result}, indent=1))


def print_floors(ref, names: list[str], max_len: int, modes: list[str]) -> None:
    for name in names:
        p = config_goldens.prepare(ref, configs.by_name(name))
        result = {mode: measure.golden_floor(ref, p, mode, max_len) for mode in modes}
        print(json.dumps({name: result}, indent=1))


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    ref = load_reference(args.reference, args.allow_other_reference)
    if args.measure:
        print_measurements(ref, args.configs, args.measure)
        return
    if args.floor:
        print_floors(ref, args.configs, args.floor, args.floor_modes)
        return
    parts = set(args.parts)
    if "quantisers" in parts:
        print(write_quantisers(ref, args.out))
    for name in args.configs:
        for path in config_goldens.write(ref, configs.by_name(name), args.out, parts, COMMAND):
            print(path)
    write_manifest(ref, args.out)


if __name__ == "__main__":
    main()
