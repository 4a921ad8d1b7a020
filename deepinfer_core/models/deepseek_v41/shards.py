"""Whole-file checks of safetensors shards before any tensor is read: a truncated shard is reported with the
first tensor whose bytes it lacks (``safe_open`` itself would only name the file)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointError

HEADER_LIMIT = 100 * 1024 * 1024


def truncated_tensor(path, size: int) -> str | None:
    """Why the safetensors file at ``path`` (``size`` bytes) cannot hold its tensors, or None."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path.name} is {size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > HEADER_LIMIT or 8 + n > size:
            return f"{path.name}: its header needs {n} bytes, the file has {size - 8} after the length"
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return f"{path.name}: invalid safetensors header: {e}"
    data = size - 8 - n
    for name, meta in sorted(header.items(), key=lambda kv: str(kv[0])):
        if name == "__metadata__" or not isinstance(meta, dict):
            continue
        end = (meta.get("data_offsets") or [0, 0])[1]
        if end > data:
            return f"truncated: {name} ({path.name}) ends at byte {end} of the data, the file holds {data}"
    return None


def check_shards(root: Path) -> None:
    """Check every ``*.safetensors`` file directly in ``root`` (run before :class:`CheckpointReader` opens
    them; the reader checks that the index and shards agree)."""
    for path in sorted(Path(root).glob("*.safetensors")):
        why = truncated_tensor(path, path.stat().st_size)
        if why:
            raise CheckpointError(f"checkpoint {root}: {why}")
