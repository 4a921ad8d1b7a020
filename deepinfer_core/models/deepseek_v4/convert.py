"""Rewrite a DeepSeek-V4 checkpoint directory, tensor by tensor, into DeepSeek's published layout.

- :func:`quantize_checkpoint`: FP8 e4m3 (128x128 block scales) for the projections DeepSeek ships in FP8
  (``attn.wq_a / wq_b / wkv / wo_a / wo_b``, ``attn.indexer.wq_b``, shared and routed experts, MTP's
  ``e_proj / h_proj``), routed experts optionally FP4 e2m1 (ue8m0 scale per 32 inputs). The compressors,
  the indexer's ``weights_proj``, the router, norms, embeddings and head stay in the source dtype, as in
  DeepSeek's checkpoints. Scales are stored as ``<module>.scale``: ``float8_e8m0fnu`` for ``scale_fmt="ue8m0"``
  (and always for FP4), float32 otherwise.
- :func:`dequantize_checkpoint`: the inverse, every quantized weight dequantized (the same block-by-block
  arithmetic the reference linear uses), for comparisons.

Either accepts any input layout the model loads (DeepSeek's, transformers'). Only one source tensor and the
current output shard are in memory at a time.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import save_file

from deepinfer_core.models.deepseek_v4.checkpoint import INDEX, CheckpointReader
from deepinfer_core.models.deepseek_v4.layout import canonical_name, scale_companions
from deepinfer_core.models.deepseek_v4.params import quantized
from deepinfer_core.ops.quant_formats import ScaleFmt, dequant, quantize_fp4_e2m1, quantize_fp8_block
from deepinfer_core.ops.weights import QuantizedWeight

FP8_LINEARS = re.compile(
    r"^(layers|mtp)\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123]|e_proj|h_proj)\.weight$"
)
ROUTED_EXPERT = re.compile(r"^(layers|mtp)\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
STACKED = re.compile(r"^(layers\.\d+\.ffn\.experts)\.(gate_up_proj|down_proj)$")


def _source_tensors(reader: CheckpointReader) -> Iterator[tuple[str, torch.Tensor]]:
    """(DeepSeek name, float or integer tensor) for every tensor; quantized sources are dequantized,
    transformers' stacked experts split per expert."""
    companions = scale_companions(set(reader.keys()))
    skip = set(companions.values())
    for key in reader.keys():
        if key in skip:
            continue
        t = reader.get(key)
        if key in companions:
            qs = reader.get(companions[key])
            shape = (t.shape[0], t.shape[1] * (1 if t.dtype == torch.float8_e4m3fn else 2))
            t = dequant(quantized(t, qs, shape, torch.device("cpu")))
        name = canonical_name(key)
        m = STACKED.match(name)
        if m is None:
            yield name, t
        elif m.group(2) == "down_proj":
            yield from ((f"{m.group(1)}.{e}.w2.weight", t[e].contiguous()) for e in range(t.shape[0]))
        else:
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{m.group(1)}.{e}.w1.weight", t[e, :inter].contiguous()
                yield f"{m.group(1)}.{e}.w3.weight", t[e, inter:].contiguous()


class _ShardWriter:
    def __init__(self, dst: Path, shard_bytes: int):
        self.dst, self.shard_bytes = dst, shard_bytes
        self.files: list[dict[str, torch.Tensor]] = []
        self.current: dict[str, torch.Tensor] = {}
        self.size = 0
        self.weight_map: dict[str, str] = {}
        self._names: list[str] = []

    def add(self, name: str, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        if self.current and self.size + nbytes > self.shard_bytes:
            self._flush()
        self.current[name] = t.contiguous()
        self.size += nbytes

    def _flush(self) -> None:
        file = f"model-{len(self._names) + 1:05d}.safetensors"
        save_file(self.current, str(self.dst / file))
        self._names.append(file)
        self.weight_map.update({k: file for k in self.current})
        self.current, self.size = {}, 0

    def close(self) -> None:
        if self.current:
            self._flush()
        (self.dst / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": self.weight_map}, indent=1))


def _store_scale(scale: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    return scale.to(torch.float8_e8m0fnu) if ue8m0 else scale


def _quantize(
    name: str, t: torch.Tensor, experts: str, scale_fmt: ScaleFmt
) -> list[tuple[str, torch.Tensor]]:
    base = name[: -len(".weight")]
    if ROUTED_EXPERT.match(name) and experts == "fp4":
        q = quantize_fp4_e2m1(t)
        return [(name, q.data.view(torch.float4_e2m1fn_x2)), (f"{base}.scale", _store_scale(q.scale, True))]
    if FP8_LINEARS.match(name) or ROUTED_EXPERT.match(name):
        q = quantize_fp8_block(t, scale_fmt)
        return [(name, q.data), (f"{base}.scale", _store_scale(q.scale, scale_fmt == "ue8m0"))]
    return [(name, t)]


def _rewrite(src: Path, dst: Path, shard_bytes: int, convert) -> tuple[CheckpointReader, dict]:
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    reader = CheckpointReader(src)
    writer = _ShardWriter(dst, shard_bytes)
    for name, t in _source_tensors(reader):
        for out_name, out in convert(name, t):
            writer.add(out_name, out)
    writer.close()
    reader.close()
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in (INDEX, "config.json"):
            shutil.copy(f, dst / f.name)
    return reader, json.loads((src / "config.json").read_text())


def quantize_checkpoint(
    src: Path,
    dst: Path,
    experts: Literal["fp8", "fp4"] = "fp8",
    scale_fmt: ScaleFmt = "ue8m0",
    shard_bytes: int = 1 << 30,
) -> Path:
    """Write ``src`` to ``dst`` as an FP8 (or FP8 + FP4-experts) checkpoint in DeepSeek's layout."""
    if experts not in ("fp8", "fp4") or scale_fmt not in ("ue8m0", None):
        raise ValueError(
            f"experts must be 'fp8' or 'fp4' and scale_fmt 'ue8m0' or None, got {experts!r}, {scale_fmt!r}"
        )
    _, config = _rewrite(src, dst, shard_bytes, lambda n, t: _quantize(n, t, experts, scale_fmt))
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": scale_fmt,
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    }
    if experts == "fp4":
        config["expert_dtype"] = "fp4"
    else:
        config.pop("expert_dtype", None)
    (Path(dst) / "config.json").write_text(json.dumps(config, indent=1))
    return Path(dst)


def dequantize_checkpoint(
    src: Path, dst: Path, dtype: torch.dtype = torch.float32, shard_bytes: int = 1 << 30
) -> Path:
    """Write ``src`` to ``dst`` in DeepSeek's layout with every weight dequantized to ``dtype``."""
    _, config = _rewrite(
        src, dst, shard_bytes, lambda n, t: [(n, t.to(dtype) if t.is_floating_point() else t)]
    )
    config.pop("quantization_config", None)
    config.pop("expert_dtype", None)
    (Path(dst) / "config.json").write_text(json.dumps(config, indent=1))
    return Path(dst)


__all__ = ["QuantizedWeight", "dequantize_checkpoint", "quantize_checkpoint"]
