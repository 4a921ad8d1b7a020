"""Engine configuration: one frozen pydantic model.

Every field can be set, in increasing precedence, by its default, a config file
(``--config file.toml|yaml|json``), a ``DEEPINFER_<FIELD>`` environment variable, and an explicit
argument (``LLM(field=...)`` or a CLI flag). Unknown fields are errors.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

ENV_PREFIX = "DEEPINFER_"
log = logging.getLogger("deepinfer.config")

#: ``DEEPINFER_*`` variables that are not engine fields: read by the platforms (their tuning switches),
#: the server, and the build and training tools. Any other ``DEEPINFER_*`` variable is warned about,
#: since it is most likely a misspelled field (``DEEPINFER_MAX_NUM_SEQ``) that would be ignored.
OTHER_VARIABLES = frozenset(
    {
        "DEEPINFER_NUM_THREADS",
        "DEEPINFER_HOST_RESERVE",
        "DEEPINFER_PDL",
        "DEEPINFER_HC_FUSED",
        "DEEPINFER_SPLITK_FINISH",
        "DEEPINFER_FP4_H2",
        "DEEPINFER_CUDA_TILELANG",
        "DEEPINFER_ASCEND_FUSED",
        "DEEPINFER_ASCEND_GRAPHS",
        "DEEPINFER_API_KEY",
        "DEEPINFER_TORCH_SPEC",
        "DEEPINFER_TRITON_SPEC",
        "DEEPINFER_RAW_ONLY",
        "DEEPINFER_CACHE",
        "DEEPINFER_V41_REFERENCE",
    }
)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, the value and what is allowed."""


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str | None = Field(
        None, description="checkpoint directory; None uses the built-in demo checkpoint"
    )
    backend: str = Field("auto", description='platform name, or "auto" for the best available')
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3"] = Field(
        "auto", description='attention KV pools: "auto" (the model dtype) or "fp8" (e4m3, RoPE channels kept)'
    )
    seed: int = 0
    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int = Field(64, ge=1)
    max_n: int = Field(128, ge=1, description="most samples (SamplingParams.n) one request may ask for")
    max_num_batched_tokens: int = Field(2048, ge=1)
    block_size: int | None = Field(
        None, ge=1, description="tokens per KV block; None picks the smallest valid"
    )
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    speculative_config: dict[str, Any] | None = None
    structured_outputs_backend: str = Field(
        "xgrammar",
        description='grammar backend: "xgrammar", "llguidance", "auto" (deepinfer-structured) or one a plugin '
        "registers; checked against the installed ones when the engine is built",
    )
    structured_outputs_max_spec_bytes: int = Field(
        65536,
        ge=1,
        description="largest JSON schema, regex, grammar or choice list a request may give, bytes",
    )
    structured_outputs_compile_timeout_s: float = Field(
        10.0, gt=0, description="longest a request's grammar may take to compile, seconds"
    )
    skip_tokenizer_init: bool = False
    check_weights_finite: bool = Field(
        True, description="refuse checkpoints with NaN / Inf weights (skip for a trusted 400 GB checkpoint)"
    )
    allow_external_shards: bool = Field(
        False,
        description="let checkpoint shards (or their symlinks) resolve outside the checkpoint directory",
    )
    enforce_eager: bool = Field(False, description="never capture decode steps as graphs")
    max_cudagraph_capture_size: int = Field(
        256, ge=1, description="largest decode batch captured as a graph (capped at max_num_seqs)"
    )
    batch_invariant: bool = Field(
        True, description="row results independent of batch composition (reference ops)"
    )
    data_parallel_size: int = Field(1, ge=1)
    expert_parallel: bool = False
    eplb: dict[str, Any] | None = None
    dist_timeout_s: float = Field(
        120.0, gt=0, le=86400, description="bound on every collective between ranks, seconds"
    )
    dist_secret: SecretStr | None = Field(
        None,
        description="shared secret that authenticates control messages between ranks; single-host runs "
        "make one per run, torchrun runs need the same value on every host",
    )
    strict_plugins: bool = False
    plugins: list[str] | None = Field(None, description="entry-point names to load; None loads all, [] none")

    @field_validator("backend")
    @classmethod
    def _backend_nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("backend must be a platform name or 'auto'")
        return v.strip()

    @field_validator("structured_outputs_backend")
    @classmethod
    def _grammar_backend_nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("structured_outputs_backend must be the name of a grammar backend")
        return v.strip()


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file into a dict of config fields.

    A TOML file may put the fields at top level or under a ``[deepinfer]`` table."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    suffix = p.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(
            f"config file {str(p)!r}: unsupported extension {suffix!r}; use .toml, .yaml, .yml or .json"
        )
    try:
        data = _parse_config_text(p.read_text(), suffix)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {str(p)!r} is not valid {suffix[1:].upper()}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of field names to values")
    if isinstance(data.get("deepinfer"), dict):
        data = data["deepinfer"]
    return data


def _parse_config_text(text: str, suffix: str) -> Any:
    if suffix == ".toml":
        return tomllib.loads(text)
    if suffix == ".json":
        return json.loads(text)
    import yaml

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from None


def _env_value(name: str, raw: str) -> Any:
    field = EngineConfig.model_fields[name]
    if name == "plugins":
        return [s.strip() for s in raw.split(",") if s.strip()]
    if raw.strip().lower() in ("none", "null") and field.default is None:
        return None
    ann = str(field.annotation)
    if "dict" in ann:
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be JSON: {e}") from None
    return raw  # pydantic coerces "1", "true", "0.5" ...


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """``DEEPINFER_<FIELD>`` variables as config values. ``DEEPINFER_PLUGINS`` is comma-separated. Other
    ``DEEPINFER_*`` variables that nothing reads are warned about, with the closest field name."""
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    known = {ENV_PREFIX + name.upper(): name for name in EngineConfig.model_fields}
    for key in environ:
        if key in known:
            out[known[key]] = _env_value(known[key], environ[key])
        elif key.startswith(ENV_PREFIX) and key not in OTHER_VARIABLES:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            log.warning("deepinfer: ignoring unknown environment variable %s%s", key, hint)
    return out


def load_config(
    config_file: str | Path | None = None, environ: dict[str, str] | None = None, **explicit: Any
) -> EngineConfig:
    """Merge file < environment < explicit values into a validated :class:`EngineConfig`."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(read_config_file(config_file))
    merged.update(env_overrides(environ))
    merged.update({k: v for k, v in explicit.items()})
    try:
        return EngineConfig(**merged)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def format_validation_error(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(EngineConfig.model_fields)
            lines.append(f"unknown parameter {loc!r}; allowed parameters: {allowed}")
        else:
            lines.append(f"{loc}={err.get('input')!r}: {err['msg']}")
    return "invalid engine configuration: " + "; ".join(lines)
