"""On-demand quantized copies of a checkpoint (``EngineConfig.quantization``): the project's own tool
(:func:`~deepinfer_core.models.deepseek_v4.convert.quantize_checkpoint`) writes the copy once, keyed by the
source's files and the format, and later loads reuse it. This is how the FP8 demo checkpoint is made: the
package ships only the BF16 one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from deepinfer_core.config import ConfigError

#: bump when the quantization tool's output changes, so stale copies are not reused
TOOL_VERSION = 1


def quantized_copy(src: Path, fmt: str, cache_dir: str | None) -> Path:
    """``src`` quantized as ``fmt`` ("fp8", or "fp4" for FP8 with FP4 routed experts) under ``cache_dir``
    (default ``<temp dir>/deepinfer-quantized``), written on first use. The copy's name hashes the source's
    file names, sizes and modification times, so a changed source gets a new copy."""
    from deepinfer_core.models.deepseek_v4.convert import quantize_checkpoint

    config = json.loads((src / "config.json").read_text())
    if config.get("quantization_config"):
        raise ConfigError(f"quantization={fmt!r}: model={str(src)!r} is already quantized")
    root = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir()) / "deepinfer-quantized"
    dst = root / f"{src.name}-{fmt}-{_fingerprint(src, fmt)}"
    if (dst / "config.json").is_file():
        return dst
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{dst.name}."))
    quantize_checkpoint(src, tmp / "ckpt", experts="fp4" if fmt == "fp4" else "fp8")
    try:
        os.replace(tmp / "ckpt", dst)  # atomic: a concurrent load sees no copy or a whole one
    except OSError:
        if not (dst / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _fingerprint(src: Path, fmt: str) -> str:
    h = hashlib.sha256(f"{TOOL_VERSION}/{fmt}".encode())
    for f in sorted(src.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]
