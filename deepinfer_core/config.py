"""Engine configuration: one frozen pydantic model, and the only reader of the environment.

Every field can be set, in increasing precedence, by its default, a config file
(``--config file.toml|yaml|json``), a ``DEEPINFER_<FIELD>`` environment variable, and an explicit
argument (``LLM(field=...)`` or a CLI flag). Unknown fields are errors. A platform's settings are a section
keyed by its name, set the same three ways (``[cuda_sm100]`` table, ``DEEPINFER_CUDA_SM100__PDL``,
``LLM(cuda_sm100={...})``) and checked against the platform's :class:`PlatformSettings` model once the
plugins are loaded (:mod:`deepinfer_core.platforms.settings`).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import tomllib
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

ENV_PREFIX = "DEEPINFER_"
log = logging.getLogger("deepinfer.config")

#: ``DEEPINFER_*`` variables that are not settings: the server's key, and the build, training and test tools'
#: switches. Any other ``DEEPINFER_*`` variable that is neither a field nor a ``<PLATFORM>__<FIELD>`` setting is
#: warned about, since it is most likely a misspelled field (``DEEPINFER_MAX_NUM_SEQ``) that would be ignored.
OTHER_VARIABLES = frozenset(
    {
        "DEEPINFER_API_KEY",
        "DEEPINFER_TORCH_SPEC",
        "DEEPINFER_TRITON_SPEC",
        "DEEPINFER_RAW_ONLY",
        "DEEPINFER_CACHE",
        "DEEPINFER_V41_REFERENCE",
        "DEEPINFER_CHAT_REFERENCE",
    }
)
#: ``DEEPINFER_<PLATFORM>__<FIELD>``: a field of a platform's section (``DEEPINFER_CUDA_SM100__PDL=0``)
SECTION_DELIMITER = "__"
S = TypeVar("S", bound="PlatformSettings")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, the value and what is allowed."""


class PlatformSettings(BaseModel):
    """Base of a platform's settings (:attr:`deepinfer_core.platforms.base.Platform.settings_model`): typed,
    documented fields with defaults, frozen, unknown fields refused. The platform's section of the engine
    configuration, keyed by its name: ``LLM(cuda_sm100={"pdl": False})``, ``DEEPINFER_CUDA_SM100__PDL=0``, or a
    ``[cuda_sm100]`` table in a config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str | None = Field(
        None,
        description="checkpoint directory, or 'demo' / 'demo-v41' / 'demo-v4' (the shipped demos); None uses "
        "the V4.1 demo",
    )
    backend: str = Field("auto", description='platform name, or "auto" for the best available')
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "unquantized"] = Field(
        "auto",
        description='attention KV pools: "auto" (the model\'s own: V4 the model dtype, V4.1 its trained FP8 / '
        'FP4 cache), "fp8" (V4: e4m3, RoPE channels kept) or "unquantized" (the model dtype, no KV rounding)',
    )
    activation_quant: Literal["none", "fp8"] = Field(
        "none",
        description='inputs of FP8 / FP4 GEMMs: "none" (multiplied as they are: the exact path) or "fp8" '
        "(DeepSeek-V4.1's release numerics: e4m3 with one ue8m0 scale per 32 values, as its reference "
        "inference quantises every FP8 / FP4 GEMM input; V4.1 only)",
    )
    seed: int = 0
    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int = Field(64, ge=1)
    max_n: int = Field(128, ge=1, description="most samples (SamplingParams.n) one request may ask for")
    max_num_batched_tokens: int = Field(2048, ge=1)
    block_size: int | None = Field(
        None, ge=1, description="tokens per KV block; None picks the smallest valid"
    )
    quantization: Literal["fp8", "fp4"] | None = Field(
        None,
        description='quantize an unquantized DeepSeek-V4 checkpoint on load with the project\'s own tool: "fp8" '
        '(e4m3, 128x128 block scales, as DeepSeek ships) or "fp4" (FP8, routed experts FP4 e2m1); the copy is '
        "written once to quantization_cache_dir and reused",
    )
    quantization_cache_dir: str | None = Field(
        None,
        description="where on-demand quantized copies are kept; None: <system temp dir>/deepinfer-quantized",
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
    engram_in_step: bool | None = Field(
        None,
        description="V4.1's Engram tables copied to page-locked host memory that the device reads in place, so "
        "a step (and its graph) reads its rows with no host wait; False: the rows are read by a host thread and "
        "copied; None: on where the platform reads host memory and the tables fit in half the host's memory",
    )
    enforce_eager: bool = Field(False, description="never capture decode steps as graphs")
    async_scheduling: bool | None = Field(
        None,
        description="overlap scheduling: prepare step N+1 and process step N-1's tokens while the device runs "
        "step N (exact: the same tokens as without); None: the platform's default (on where the device runs "
        "queued work on its own, e.g. CUDA; off on the CPU reference platform)",
    )
    swa_bounded_replay: bool = Field(
        False,
        description="run the layers a model declares (V4.1: its decoder) on only the last window of each "
        "prefill chunk; not exact, so off by default",
    )
    max_encoder_patches: int | None = Field(
        None,
        ge=1,
        description="image input: most ViT patches one vision-tower pass encodes (a step's images are packed "
        "into passes that fit; one image is never split, and an image with more patches is refused, its "
        "request failing alone); None: one image a pass",
    )
    device_plan: bool = Field(
        True,
        description="build a static step's slot plan on the device, inside its captured graph, where the model "
        "can (DeepSeek-V4; V4.1 with its Engram tables read in the step): the host then builds and copies no "
        "plan a step (the backend's fused static_plan: three launches on cuda_sm100). Only graph-captured steps "
        "have one. On by default: V4's engine on an H100 at batch 1, 1.21 ms a step against 1.35-1.38 with the "
        "host's plan, the same at 16 and 64, 13.16 against 13.25 ms at 256 (RESULTS v41)",
    )
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
    sections: dict[str, Any] = Field(
        default_factory=dict,
        description="platform settings by platform name, each given as <platform>={...}; checked against the "
        "platform's settings model when the engine is built",
    )

    @model_validator(mode="before")
    @classmethod
    def _collect_sections(cls, data: Any) -> Any:
        return split_sections(data) if isinstance(data, dict) else data

    def platform_settings(self, platform: str, model: type[S]) -> S:
        """``platform``'s section as its settings ``model``: the object the engine's build validated, or (for a
        config that was not bound to the installed platforms) validated now.

        :raises ConfigError: naming the field and what is allowed."""
        value = self.sections.get(platform, {})
        return value if isinstance(value, model) else validate_section(platform, model, value)

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

    A TOML file may put the fields at top level or under a ``[deepinfer]`` table; a platform's section is a
    table of its name (``[cuda_sm100]``, or ``[deepinfer.cuda_sm100]`` under ``[deepinfer]``)."""
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


def env_overrides(
    environ: Mapping[str, str] | None = None, warn: bool = True, ignore: Iterable[str] = ()
) -> dict[str, Any]:
    """``DEEPINFER_<FIELD>`` variables as config values, ``DEEPINFER_<PLATFORM>__<FIELD>`` as values of platform
    sections (raw strings, which the section's model coerces). ``DEEPINFER_PLUGINS`` is comma-separated. Other
    ``DEEPINFER_*`` variables that nothing reads are warned about, with the closest field name, except those in
    ``ignore`` (another settings model's, read with :func:`env_fields`)."""
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    sections: dict[str, dict[str, str]] = {}
    known = {ENV_PREFIX + name.upper(): name for name in EngineConfig.model_fields if name != "sections"}
    skip = set(ignore)
    for key in environ:
        rest = key[len(ENV_PREFIX) :]
        if key in skip:
            continue
        if key in known:
            out[known[key]] = _env_value(known[key], environ[key])
        elif key.startswith(ENV_PREFIX) and SECTION_DELIMITER in rest.strip("_"):
            section, field = rest.lower().split(SECTION_DELIMITER, 1)
            sections.setdefault(section, {})[field] = environ[key]
        elif warn and key.startswith(ENV_PREFIX) and key not in OTHER_VARIABLES:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = (
                f"did you mean {close[0]}?"
                if close
                else f"a platform's setting is {ENV_PREFIX}<PLATFORM>__<FIELD>"
            )
            log.warning("deepinfer: ignoring unknown environment variable %s; %s", key, hint)
    return merge_sources(out, {"sections": sections}) if sections else out


def env_fields(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The raw ``DEEPINFER_<NAME>`` values of ``names``: the fields of a settings model above the engine's (the
    server's), which that model coerces. Keeps every read of the environment in this module."""
    environ = os.environ if environ is None else environ
    return {n: environ[ENV_PREFIX + n.upper()] for n in names if ENV_PREFIX + n.upper() in environ}


def split_sections(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each key that is no field and holds a mapping (``cuda_sm100={"pdl": False}``, a TOML
    ``[cuda_sm100]`` table) moved into ``sections``: a platform's settings, whose fields are only known once the
    plugins are loaded (:func:`deepinfer_core.platforms.settings.bind_settings` checks them)."""
    fields = EngineConfig.model_fields
    named = {k: v for k, v in data.items() if k not in fields and isinstance(v, Mapping | BaseModel)}
    rest = {k: v for k, v in data.items() if k not in named}
    return merge_sources(rest, {"sections": named}) if named else rest


def merge_sources(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: fields replaced, platform sections merged field by field (a file's
    ``[cuda_sm100] pdl = false`` and ``DEEPINFER_CUDA_SM100__HC_FUSED=0`` both hold)."""
    out = {**base, **{k: v for k, v in over.items() if k != "sections"}}
    sections = {name: dict(_section_values(v)) for name, v in (base.get("sections") or {}).items()}
    for name, values in (over.get("sections") or {}).items():
        sections[name] = {**sections.get(name, {}), **_section_values(values)}
    if sections or "sections" in base or "sections" in over:
        out["sections"] = sections
    return out


def _section_values(values: Any) -> dict[str, Any]:
    if isinstance(values, BaseModel):
        return values.model_dump(exclude_unset=True)
    if not isinstance(values, Mapping):
        raise ConfigError(f"a platform section must be a mapping of its fields to values, not {values!r}")
    return dict(values)


def load_config(
    config_file: str | Path | None = None, environ: Mapping[str, str] | None = None, **explicit: Any
) -> EngineConfig:
    """Merge file < environment < explicit values into a validated :class:`EngineConfig`."""
    merged: dict[str, Any] = {}
    for source in (
        read_config_file(config_file) if config_file is not None else {},
        env_overrides(environ),
        explicit,
    ):
        merged = merge_sources(merged, split_sections(source))
    try:
        return EngineConfig(**merged)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def setting_sources(
    config_file: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Where each value that is set comes from: ``"config file"`` or the ``DEEPINFER_*`` variable (which wins),
    keyed by field name or ``platform.field``; a key that is absent is at its default."""
    out: dict[str, str] = {}
    file_data = split_sections(read_config_file(config_file)) if config_file is not None else {}
    env_data = env_overrides(environ, warn=False)
    for data, env in ((file_data, False), (env_data, True)):
        for key in data:
            if key != "sections":
                out[key] = f"{ENV_PREFIX}{key.upper()}" if env else "config file"
        for name, values in (data.get("sections") or {}).items():
            for key in values:
                where = (
                    f"{ENV_PREFIX}{name.upper()}{SECTION_DELIMITER}{key.upper()}" if env else "config file"
                )
                out[f"{name}.{key}"] = where
    return out


def validate_section(name: str, model: type[S], values: Any) -> S:
    """Platform ``name``'s section ``values`` as ``model``. :raises ConfigError: naming ``name.field``."""
    try:
        return model.model_validate(_section_values(values))
    except ValidationError as e:
        raise ConfigError(
            format_validation_error(e, prefix=f"{name}.", allowed=list(model.model_fields))
        ) from None


def format_validation_error(e: ValidationError, prefix: str = "", allowed: list[str] | None = None) -> str:
    """One line naming each bad field (``prefix`` + its name), its value and what is allowed."""
    allowed = allowed if allowed is not None else [f for f in EngineConfig.model_fields if f != "sections"]
    lines = []
    for err in e.errors():
        loc = prefix + ".".join(str(x) for x in err["loc"]) if err["loc"] else prefix.rstrip(".") or "config"
        if err["type"] == "extra_forbidden":
            where = f" of {prefix.rstrip('.')}" if prefix else ""
            lines.append(f"unknown parameter {loc!r}; allowed parameters{where}: {', '.join(allowed)}")
        else:
            lines.append(f"{loc}={err.get('input')!r}: {err['msg']}")
    return "invalid engine configuration: " + "; ".join(lines)
