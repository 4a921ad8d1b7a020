"""Import the vision oracle from a folder and run it faithfully in float32 on the CPU.

The folder (``.v41vision/`` by convention, git-ignored) holds:

- ``image_processor.py``: DeepSeek's ``inference/image_processor.py`` of DeepSeek-V4.1-Flash at revision
  ``dba1be0a40aa45a94ad051997016db3960a90277``, as vendored (with a header) next to the ``model.py`` whose
  sha256 ``docs/v41_reference.md`` records;
- ``vision.py``: a public port of DeepSeek's ``inference/vision.py`` (FreeToken's
  ``python/freetoken/models/deepseek_v41/vision.py``, ArqAlice/FreeToken at 1d7508813b), since DeepSeek's own
  file is not in the stored index;
- ``vision_crosscheck.py``: the tower classes of a second, independent port, run on the same weights to check
  that the first is faithful (see docs/vision.md).

How the tower is run: the modules are built as the port builds them (its linears in bfloat16), then widened
to float32 (lossless), and loaded from the published-layout tensors, widened to float32 too. Patches are the
processor's bfloat16 values widened to float32. One image per call, as the release's ``encode_image`` does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch

EXPECTED_SHA256 = {
    "image_processor.py": "cf7cecf728c736ad3d492f535ab26ff6e9b92185ea29c0759e4ef77e61a6d7dc",
    "vision.py": "9d6d472b7ed8b565c66706db24ac5e68e4b5d2026b2b84c9f8f8efa908df04bd",
    "vision_crosscheck.py": "7cf8bb8951c616066f9de39fdd44e8e4bcc860cc5821f5d0c3dd9292b784a655",
}
PACKAGE = "deepseek_v41_vision_oracle"


@dataclass
class Oracle:
    processor: ModuleType
    vision: ModuleType
    crosscheck: ModuleType
    sha256: dict[str, str]


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{name}", path / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_oracle(path: Path, allow_other: bool = False) -> Oracle:
    path = Path(path).resolve()
    sums = {f: hashlib.sha256((path / f).read_bytes()).hexdigest() for f in EXPECTED_SHA256}
    wrong = [f for f, h in EXPECTED_SHA256.items() if sums[f] != h]
    if wrong and not allow_other:
        raise SystemExit(f"{path}: {wrong} differ from the recorded sha256 (see docs/vision.md)")
    mods = {m: _import(path, m) for m in ("image_processor", "vision", "vision_crosscheck")}
    return Oracle(mods["image_processor"], mods["vision"], mods["vision_crosscheck"], sums)


def oracle_args(cfg: dict) -> SimpleNamespace:
    """The reference's ``ModelArgs`` fields the processor and the tower read, from a ``vision_*`` dict."""
    return SimpleNamespace(**cfg, vision_enabled=cfg.get("vision_n_layers", 0) > 0)


def build_tower(module: ModuleType, args: SimpleNamespace, stored: dict[str, torch.Tensor]):
    """``(vit, aligner, delimiters)`` of one oracle module, float32, loaded from ``stored``."""
    vit, aligner = module.ViT(args).float(), module.Aligner(args).float()
    for prefix, part in (("vision.", vit), ("aligner.", aligner)):
        state = {k[len(prefix) :]: v.float() for k, v in stored.items() if k.startswith(prefix)}
        part.load_state_dict(state, strict=True)
    delimiters = {k: stored[k].float() for k in ("image_start", "image_end", "image_newline")}
    return vit.eval(), aligner.eval(), delimiters


@torch.inference_mode()
def encode_span(
    tower, patches: torch.Tensor, n_vit_h: int, n_vit_w: int, types: torch.Tensor, ip: ModuleType
):
    """The image's span of embeddings as the release's ``merge_image_embeddings`` fills it, plus the parts."""
    vit, aligner, delim = tower
    features = vit(patches.float(), n_vit_h, n_vit_w)
    rows = aligner(features, n_vit_h, n_vit_w)
    span = torch.empty(types.numel(), rows.shape[-1])
    span[types == ip.IMAGE_START] = delim["image_start"]
    span[types == ip.IMAGE_END] = delim["image_end"]
    span[types == ip.IMAGE_NEW_LINE] = delim["image_newline"]
    span[types == ip.IMAGE] = rows
    return features, rows, span
