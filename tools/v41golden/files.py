"""Writing golden files byte-for-byte reproducibly, each carrying its provenance.

Every golden ``.safetensors`` holds, as its only header metadata entry, ``provenance``: a JSON object
with the reference's revision and sha256 sums, the torch version, the exact command, the seeds and the config;
the ``.json`` files carry the same object under ``"provenance"``. JSON is written with sorted keys and a final
newline, so reruns produce identical bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

REVISION = "dba1be0a40aa45a94ad051997016db3960a90277"
COMMAND = "python tools/v41_goldens.py --reference <REF> --out tests/data/v41"


def provenance(
    sha256: dict[str, str], command: str, seeds: dict | None = None, config: dict | None = None
) -> dict:
    out = {
        "reference": {"revision": REVISION, "sha256": dict(sorted(sha256.items()))},
        "torch": torch.__version__.split("+")[0],
        "command": command,
    }
    if seeds is not None:
        out["seeds"] = seeds
    if config is not None:
        out["config"] = config
    return out


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(obj), encoding="utf-8")


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], prov: dict | None = None) -> None:
    """``tensors`` (made contiguous) to ``path``; ``prov`` goes into the header as ``provenance``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # one metadata key only: safetensors writes several in hash order, which changes from run to run
    meta = (
        {"format": "pt"}
        if prov is None
        else {"provenance": json.dumps(prov, sort_keys=True, ensure_ascii=False)}
    )
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
