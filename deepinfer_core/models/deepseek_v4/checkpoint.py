"""Reading safetensors checkpoints tensor by tensor: sharded (``model.safetensors.index.json``) or not.

Shard names come from an untrusted index, so each must be a relative path that resolves inside the
checkpoint directory: ``/etc/shadow``, ``../../x`` and symlinks that leave the directory are refused,
except the Hugging Face cache's own layout (``snapshots/<rev>/f`` -> ``blobs/<hash>`` of the same
repository) or with ``allow_external_shards=True``.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePath

import torch
from safetensors import safe_open

INDEX = "model.safetensors.index.json"
MAX_LISTED = 20


class CheckpointError(ValueError):
    """A checkpoint directory cannot be loaded; the message says what and where."""


def problem_list(header: str, problems: list[str]) -> str:
    """``header`` and up to :data:`MAX_LISTED` problems, one per line."""
    lines = [f"{header}: {len(problems)} problem(s)"] + [f"  {p}" for p in problems[:MAX_LISTED]]
    if len(problems) > MAX_LISTED:
        lines.append(f"  ... and {len(problems) - MAX_LISTED} more")
    return "\n".join(lines)


class CheckpointReader:
    """Names, shapes and tensors of a checkpoint; opens each shard lazily and reads one tensor at a time."""

    def __init__(self, path: Path, allow_external: bool = False):
        self.path = Path(path)
        self.allow_external = allow_external
        self._handles: dict[str, object] = {}
        index = self.path / INDEX
        if index.is_file():
            self.weight_map = self._read_index(index)
        else:
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{self.path}: no {INDEX} and no *.safetensors file")
            for f in files:
                self._check_inside(f)
            self.weight_map = {k: f for f in files for k in self._open(f).keys()}

    def _check_inside(self, name: object) -> None:
        """Refuse a shard name that is not a relative path resolving inside the checkpoint directory."""
        if not isinstance(name, str) or not name:
            raise CheckpointError(
                f"checkpoint {self.path}: shard name {name!r} in {INDEX} is not a file name"
            )
        if self.allow_external:
            return
        parts = PurePath(name).parts
        if PurePath(name).is_absolute() or ".." in parts:
            raise CheckpointError(
                f"checkpoint {self.path}: shard {name!r} is not a relative path inside the checkpoint directory"
            )
        root, real = self.path.resolve(), (self.path / name).resolve()
        hub_blob = root.parent.name == "snapshots" and real.parent == root.parent.parent / "blobs"
        if not real.is_relative_to(root) and not hub_blob:
            raise CheckpointError(
                f"checkpoint {self.path}: shard {name!r} resolves to {str(real)!r}, outside the checkpoint "
                "directory; set allow_external_shards=True if you trust it"
            )

    def _read_index(self, index: Path) -> dict[str, str]:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{index}: not a safetensors index (needs a 'weight_map' object): {e}"
            ) from e
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: 'weight_map' must be an object of tensor name -> shard file")
        shards: dict[str, int] = {}
        for f in weight_map.values():
            self._check_inside(f)
            shards[f] = shards.get(f, 0) + 1
        missing = [
            f"missing shard: {f} (holds {n} tensors)"
            for f, n in sorted(shards.items())
            if not (self.path / f).is_file()
        ]
        if missing:
            raise CheckpointError(
                problem_list(f"checkpoint {self.path}: shards listed in {INDEX} are absent", missing)
            )
        absent = [
            f"{k}: listed in {INDEX} for {f}, but {f} has no such tensor"
            for k, f in weight_map.items()
            if k not in self._keys_of(f)
        ]
        if absent:
            raise CheckpointError(problem_list(f"checkpoint {self.path}: index and shards disagree", absent))
        return dict(weight_map)

    def _open(self, file: str):
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(self.path / file), framework="pt")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{self.path / file}: cannot read safetensors file: {e}") from e
        return self._handles[file]

    def _keys_of(self, file: str) -> set[str]:
        return set(self._open(file).keys())

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def file_of(self, key: str) -> str:
        return self.weight_map[key]

    def info(self, key: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype string, shape) without reading the data. FP4 (``F4``) reports logical elements."""
        s = self._open(self.weight_map[key]).get_slice(key)
        return s.get_dtype(), tuple(s.get_shape())

    def get(self, key: str) -> torch.Tensor:
        return self._open(self.weight_map[key]).get_tensor(key)

    def close(self) -> None:
        self._handles.clear()
