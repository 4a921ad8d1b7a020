"""Write golden files of DeepSeek's chat encoders (V4 and V4.1) on generated conversations.

    python tools/chat_goldens.py --reference .chatref --out tests/data/chat

``--reference`` is a folder holding ``v4/encoding_dsv4.py`` (with V4's published ``v4/tests/``) and
``v41/encoding.py``, checked by sha256; docs/chat.md says where they come from. They are imported at run
time; nothing of them is copied. Each encoding gets ``<out>/<encoding>.json.gz``: the provenance, render
records (a case and the reference's prompt) and parse records (a completion and the reference's parse);
see ``chatgolden/records.py``. The same arguments always write the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chatgolden.oracle import SOURCES, load_oracle  # noqa: E402
from chatgolden.records import generate, published_v4  # noqa: E402

COMMAND = "python tools/chat_goldens.py --reference .chatref --out tests/data/chat"
SEED = 2024
COUNTS = {"deepseek_v4": 1500, "deepseek_v41": 2000}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--reference", type=Path, required=True, help="folder with v4/ and v41/ (see docs/chat.md)"
    )
    ap.add_argument("--out", type=Path, default=Path("tests/data/chat"))
    ap.add_argument("--encodings", nargs="*", default=list(SOURCES), choices=list(SOURCES))
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--allow-other-reference", action="store_true", help="accept files with another sha256")
    return ap.parse_args(argv)


def write_goldens(path: Path, provenance: dict, renders: list[dict], parses: list[dict]) -> None:
    """Gzipped JSON, one record a line, with a zero mtime so that a rerun writes the same bytes."""
    lines = ["{", f'"provenance": {json.dumps(provenance, ensure_ascii=False, indent=1)},']
    for name, records in (("render", renders), ("parse", parses)):
        body = ",\n".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in records)
        lines.append(f'"{name}": [\n{body}\n]' + ("," if name == "render" else ""))
    lines.append("}\n")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write("\n".join(lines).encode("utf-8"))
    path.write_bytes(buf.getvalue())


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for encoding in args.encodings:
        oracle = load_oracle(args.reference, encoding, args.allow_other_reference)
        renders, parses = generate(oracle, args.seed, range(COUNTS[encoding]))
        if encoding == "deepseek_v4":
            renders += published_v4(oracle, args.reference / "v4" / "tests")
        provenance = {
            "encoding": encoding,
            "reference": {**SOURCES[encoding], "sha256": oracle.sha256},
            "command": COMMAND,
            "seed": args.seed,
            "cases": COUNTS[encoding],
            "render_records": len(renders),
            "parse_records": len(parses),
        }
        path = args.out / f"{encoding}.json.gz"
        write_goldens(path, provenance, renders, parses)
        print(f"{path}: {len(renders)} render and {len(parses)} parse records, {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
