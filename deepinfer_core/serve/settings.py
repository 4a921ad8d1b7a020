"""Server settings: one frozen pydantic model, set like the engine's.

Every field can be set, in increasing precedence, by its default, a config file (the same
``--config file.toml|yaml|json`` as the engine's fields: the file may mix both), a ``DEEPINFER_<FIELD>``
environment variable (``DEEPINFER_API_KEY``, ``DEEPINFER_PORT``, ...), and a ``deepinfer serve`` flag.
The defaults are the safe ones: loopback only, no CORS, bounded bodies and ``max_tokens`` (``n`` is
bounded by the engine's ``max_n``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from deepinfer_core.config import (
    ENV_PREFIX,
    ConfigError,
    EngineConfig,
    env_fields,
    env_overrides,
    load_config,
    merge_sources,
    read_config_file,
    split_sections,
)


class ServeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    host: str = Field("127.0.0.1", description="address to bind; the default accepts local clients only")
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port")
    api_key: SecretStr | None = Field(
        None, description="clients must send 'Authorization: Bearer KEY' on /v1 routes"
    )
    served_model_name: str | None = Field(
        None, description="the model id clients name; default: --model's value, or 'deepinfer-demo'"
    )
    max_waiting_requests: int | None = Field(
        1024, ge=0, description="requests waiting to be scheduled beyond which the server answers 503"
    )
    max_body_bytes: int = Field(16 << 20, ge=1, description="larger request bodies get 413")
    max_tokens_limit: int = Field(
        32768, ge=1, description="largest max_tokens a request may ask for (also the chat default cap)"
    )
    retry_after_s: int = Field(1, ge=0, description="Retry-After seconds sent with 503")
    cors_allow_origins: list[str] = Field(
        default_factory=list, description="origins allowed by CORS; empty (the default): no CORS headers"
    )
    default_thinking_mode: Literal["non-think", "think-high", "think-max"] = Field(
        "non-think", description="chat thinking mode when a request names none"
    )
    chat_encoding: Literal["auto", "deepseek_v4", "deepseek_v41"] = Field(
        "auto", description="chat format; auto: the checkpoint's, from its config.json"
    )
    disable_any_whitespace: bool = Field(
        False, description="response_format JSON without whitespace between tokens (compact JSON)"
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = Field(False, description="log one line per HTTP request (uvicorn's access log)")

    def model_name(self, engine: EngineConfig) -> str:
        return self.served_model_name or engine.model or "deepinfer-demo"


def _env(environ: Mapping[str, str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in env_fields(ServeSettings.model_fields, environ).items():
        field = ServeSettings.model_fields[name]
        if "list" in str(field.annotation):
            out[name] = [s.strip() for s in raw.split(",") if s.strip()]
        elif raw.strip().lower() in ("none", "null") and field.default is None:
            out[name] = None
        else:
            out[name] = raw  # pydantic coerces "8000", "true" ...
    return out


def load_serve_config(
    config_file: str | Path | None = None,
    engine_args: dict[str, Any] | None = None,
    serve_args: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[EngineConfig, ServeSettings]:
    """Merge file < environment < arguments into the engine's config and the server's settings.

    A config file may hold fields of both; each goes to the model that owns it, and a field that
    belongs to neither is an error. ``environ`` defaults to the process environment."""
    from_file = read_config_file(config_file) if config_file is not None else {}
    serve_names = set(ServeSettings.model_fields)
    file_serve = {k: v for k, v in from_file.items() if k in serve_names}
    file_engine = {k: v for k, v in from_file.items() if k not in serve_names}
    serve_vars = [ENV_PREFIX + name.upper() for name in serve_names]
    engine = load_config(
        environ={}, **_engine_sources(file_engine, env_overrides(environ, ignore=serve_vars), engine_args)
    )
    merged = {**file_serve, **_env(environ), **(serve_args or {})}
    try:
        return engine, ServeSettings(**merged)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ConfigError(f"invalid server settings: {errs}") from None


def _engine_sources(*sources: dict[str, Any] | None) -> dict[str, Any]:
    """File < environment < arguments, platform sections merged field by field (as ``load_config`` does)."""
    merged: dict[str, Any] = {}
    for source in sources:
        merged = merge_sources(merged, split_sections(source or {}))
    return merged
