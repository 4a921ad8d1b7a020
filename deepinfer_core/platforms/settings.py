"""Platform sections of the engine configuration, checked once the installed platforms are known.

A platform declares its settings as a :class:`~deepinfer_core.config.PlatformSettings` subclass
(:attr:`~deepinfer_core.platforms.base.Platform.settings_model`); a user sets them by argument
(``LLM(cuda_sm100={"pdl": False})``), environment (``DEEPINFER_CUDA_SM100__PDL=0``) or config file
(``[cuda_sm100]`` then ``pdl = false``). :func:`bind_settings` validates every section when the engine is
built, so a misspelled platform or field fails there, naming it, and fills in the defaults.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from deepinfer_core.config import ConfigError, EngineConfig, PlatformSettings, validate_section

if TYPE_CHECKING:
    from deepinfer_core.platforms.base import Platform


def settings_models(platforms: Mapping[str, Platform]) -> dict[str, type[PlatformSettings]]:
    """``{platform name: settings model}`` of the platforms that declare settings."""
    models = {name: platforms[name].settings_model for name in platforms}
    return {name: model for name, model in models.items() if model is not None}


def bind_settings(config: EngineConfig, platforms: Mapping[str, Platform]) -> EngineConfig:
    """``config`` whose ``sections`` hold every declaring platform's validated settings (defaults where not set).

    :raises ConfigError: for a section that names no installed platform with settings, or a field its model
        does not have or a value it refuses, naming ``platform.field`` and what is allowed."""
    models = settings_models(platforms)
    unknown = sorted(set(config.sections) - set(models))
    if unknown:
        raise ConfigError(_unknown_sections(unknown, models, platforms))
    bound = {
        name: validate_section(name, model, config.sections.get(name, {})) for name, model in models.items()
    }
    return config.model_copy(update={"sections": bound})


def _unknown_sections(
    unknown: list[str], models: Mapping[str, object], platforms: Mapping[str, object]
) -> str:
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(models), n=1)
        why = "has no settings" if name in platforms else "is not an installed platform"
        parts.append(f"{name!r} {why}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    known = ", ".join(sorted(models)) or "none"
    return (
        f"invalid engine configuration: settings section {'; '.join(parts)}; platforms with settings: {known}"
    )
