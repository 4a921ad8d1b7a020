"""Find the checkpoint, pick the architecture from the registry, load model weights and tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from deepinfer_core.config import ConfigError, EngineConfig
from deepinfer_core.engine.quantize import quantized_copy
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.weight_checks import LoadOptions

if TYPE_CHECKING:
    from deepinfer_core.runtime import Runtime

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_path(config: EngineConfig) -> Path:
    from deepinfer_core.demo import DEMO_NAMES, default_checkpoint, demo_checkpoint

    if config.model is None:
        return Path(default_checkpoint())
    if config.model in DEMO_NAMES and not Path(config.model).exists():
        return demo_checkpoint(config.model)
    path = Path(config.model)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model={config.model!r} is invalid: expected a checkpoint directory with a config.json, or one "
            f"of the shipped demos {sorted(DEMO_NAMES)}"
        )
    return path


def resolve_dtype(name: str, device_type: str) -> torch.dtype:
    """``"auto"``: float32 on the CPU reference platform, bfloat16 on accelerators."""
    if name == "auto":
        return torch.float32 if device_type == "cpu" else torch.bfloat16
    return _DTYPES[name]


def model_class(path: Path, models: Any) -> type[CausalLM]:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"model={str(path)!r}: {path / 'config.json'} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model={str(path)!r}: {path / 'config.json'} must hold a JSON object")
    names = list(cfg.get("architectures") or []) + [cfg.get("model_type")]
    for name in names:
        if name and name in models:
            return models[name]
    raise ConfigError(
        f"model={str(path)!r}: architecture {names[0]!r} is not registered; registered: {sorted(models)}"
    )


def load_tokenizer(path: Path, skip: bool) -> Any:
    """The checkpoint's tokenizer, or None when it ships none (token-id prompts only). Code shipped with a
    checkpoint is never run: a tokenizer that needs it (``auto_map`` in its config) is refused."""
    if skip or not any((path / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (path / "tokenizer.json").is_file():
        # Read tokenizer.json directly: AutoTokenizer would parse config.json through transformers' own
        # config class, which rejects valid DeepSeek configs (e.g. compress ratios other than 4 and 128).
        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise ConfigError(f"model={str(path)!r}: cannot load its tokenizer: {e}") from None
        raise ConfigError(
            f"model={str(path)!r}: its tokenizer needs custom code shipped with the checkpoint (auto_map), "
            "and DeepInfer never runs code from a checkpoint (trust_remote_code=False). Ship a tokenizer.json, "
            "or pass token ids with skip_tokenizer_init=True"
        ) from None


def load(config: EngineConfig, runtime: Runtime) -> tuple[CausalLM, Any]:
    path = checkpoint_path(config)
    if config.quantization is not None:
        from deepinfer_core.models.deepseek_v4 import DeepseekV4ForCausalLM

        if model_class(path, runtime.registry.models) is not DeepseekV4ForCausalLM:
            raise ConfigError(f"quantization={config.quantization!r} converts DeepSeek-V4 checkpoints only")
        path = quantized_copy(path, config.quantization, config.quantization_cache_dir)
    cls = model_class(path, runtime.registry.models)
    dtype = resolve_dtype(config.dtype, runtime.platform.device_type)
    options = LoadOptions(config.check_weights_finite, config.allow_external_shards)
    model = cls.from_checkpoint(path, runtime.backends, dtype, options)
    supported = runtime.backends.attention.kv_cache_dtypes
    if config.kv_cache_dtype not in supported:
        raise ConfigError(
            f"kv_cache_dtype={config.kv_cache_dtype!r} is not supported by platform "
            f"{runtime.platform.name!r}; supported: {list(supported)}"
        )
    try:
        model.use_kv_cache_dtype(config.kv_cache_dtype)
        model.use_activation_quant(config.activation_quant)
        if hasattr(model, "place_engram"):  # V4.1: where its Engram tables are read from
            model.place_engram(config.engram_in_step)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return model, load_tokenizer(path, config.skip_tokenizer_init)


def model_bytes(model: CausalLM) -> int:
    """Bytes of the model's parameters (for sizing the KV budget from free device memory)."""
    if isinstance(model, torch.nn.Module):
        return sum(p.numel() * p.element_size() for p in model.parameters())
    return int(getattr(model, "num_bytes", 0))
