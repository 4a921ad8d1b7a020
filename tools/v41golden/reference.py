"""Import DeepSeek's V4.1 reference from a package folder and build it faithfully on the CPU.

The folder holds ``model.py`` and ``engram.py`` as published (sha256 below), the CPU stand-in ``kernel_cpu.py``
for the TileLang kernels and the ``vision`` / ``image_processor`` import stubs. It is imported under its own
package name, so its relative imports resolve; it needs no ``__init__.py``.

How the model is built and fed (each step is what the release does or what running it in float32 needs):

1. ``ModelArgs`` from ``inference/config.json`` plus runtime limits (``max_batch_size`` 1, ``max_seq_len``,
   ``temperature`` 0: greedy ``sample``, also inside the DSpark head);
2. the ``Transformer`` is built under float32 default dtype, so activations and norms are float32;
3. stored tensors are copied in as they are: FP8 data and E8M0 scales unchanged, the routed experts' I8 bytes
   viewed as ``float4_e2m1fn_x2``, BF16 tensors widened to the parameter's dtype; ``wo_a`` is stored FP8 but the
   model holds it dequantised (the release's ``convert.py`` does that), so it is dequantised here to BF16;
4. every parameter still in BF16 (``wo_a``, the ratio-1 compressor's ``wkv``, the indexer's ``wk`` and
   ``weights_proj``) is widened to float32 (lossless).
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

EXPECTED_SHA256 = {
    "model.py": "ef19ed51386a9f3ce54a3fd6316166e0f9d8cef727f664ecc630e1faad65bdc5",
    "engram.py": "8038b08fa69c1a787e5b4f84d051d637c02affb6b3c913b02fba1427b90ab3f7",
}
RECORDED_FILES = ("model.py", "engram.py", "kernel_cpu.py")
PACKAGE = "deepseek_v41_reference"


@dataclass
class Reference:
    path: Path
    model: types.ModuleType  # inference/model.py
    engram: types.ModuleType  # inference/engram.py
    kernel: types.ModuleType  # kernel_cpu.py
    sha256: dict[str, str]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_reference(path: Path, allow_other: bool = False) -> Reference:
    """Import the reference package at ``path``; refuse files whose sha256 is not the recorded release's."""
    path = Path(path).resolve()
    sums = {f: sha256_of(path / f) for f in RECORDED_FILES}
    wrong = [f for f, h in EXPECTED_SHA256.items() if sums[f] != h]
    if wrong and not allow_other:
        raise SystemExit(f"{path}: {wrong} differ from the release's sha256 (see docs/v41_reference.md)")
    if PACKAGE not in sys.modules:
        pkg = types.ModuleType(PACKAGE)
        pkg.__path__ = [str(path)]
        sys.modules[PACKAGE] = pkg
    mods = {m: importlib.import_module(f"{PACKAGE}.{m}") for m in ("model", "engram", "kernel_cpu")}
    return Reference(path, mods["model"], mods["engram"], mods["kernel_cpu"], sums)


def model_args(ref: Reference, args: dict, max_seq_len: int):
    """``ModelArgs`` from ``inference/config.json`` values (lists become tuples) and the runtime limits."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    return ref.model.ModelArgs(**fields, max_batch_size=1, max_seq_len=max_seq_len, temperature=0)


def dequant_fp8_block(data: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP8 ``[out, in]`` with one scale per ``block x block`` tile -> float32 (exact: scales are powers of two)."""
    out_f, in_f = data.shape
    s = scale.float().repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return data.float() * s


def _stored_value(
    name: str, p: torch.Tensor, stored: dict[str, torch.Tensor], used: set[str]
) -> torch.Tensor:
    t = stored[name]
    if p.dtype == torch.float4_e2m1fn_x2:
        return t.view(torch.float4_e2m1fn_x2)
    if t.dtype == torch.float8_e4m3fn and p.dtype != t.dtype:  # wo_a: dequantised at conversion time
        scale = name[: -len(".weight")] + ".scale"
        used.add(scale)
        return dequant_fp8_block(t, stored[scale]).to(torch.bfloat16).to(p.dtype)
    return t.to(p.dtype)


def load_stored(model: torch.nn.Module, stored: dict[str, torch.Tensor]) -> None:
    """Fill every parameter of the reference ``model`` from the published-layout tensors ``stored``."""
    used: set[str] = set()
    for name, p in model.named_parameters():  # shared embed/head appear once, under their backbone names
        if name not in stored:
            raise KeyError(f"checkpoint lacks {name}")
        value = _stored_value(name, p, stored, used)
        if value.shape != p.shape:
            raise ValueError(f"{name}: stored {tuple(value.shape)}, model {tuple(p.shape)}")
        p.data = value
        used.add(name)
    unused = sorted(set(stored) - used)
    if unused:
        raise KeyError(f"checkpoint tensors the reference does not use: {unused[:8]}")
    for p in model.parameters():
        if p.dtype == torch.bfloat16:
            p.data = p.data.float()


def build(ref: Reference, args: dict, tokenizer, stored: dict[str, torch.Tensor], max_seq_len: int):
    """A loaded reference ``Transformer`` (float32 default dtype; the previous default is restored)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        model = ref.model.Transformer(model_args(ref, args, max_seq_len), tokenizer)
    finally:
        torch.set_default_dtype(prev)
    load_stored(model, stored)
    return model.eval()
