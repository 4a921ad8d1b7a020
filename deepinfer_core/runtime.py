"""Build everything plugins contribute, once, from an :class:`EngineConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_core import builtin
from deepinfer_core.config import EngineConfig
from deepinfer_core.ops.backends import Backends
from deepinfer_core.platforms.base import Platform
from deepinfer_core.platforms.settings import bind_settings
from deepinfer_core.plugins.registry import (
    PluginHookError,
    PluginRegistry,
    load_registry,
    resolve_backends,
    select_platform,
)


@dataclass(frozen=True)
class Runtime:
    config: EngineConfig
    registry: PluginRegistry
    platform: Platform
    backends: Backends


def build_registry(
    allow: list[str] | None = None, strict: bool = False, extra_plugins: list[object] = (), entry_points=None
) -> PluginRegistry:
    """The plugins' registry with the core's built-in plugin first (:func:`load_registry`)."""
    return load_registry(builtin, allow, strict, extra_plugins, entry_points)


def build_runtime(config: EngineConfig, extra_plugins: list[object] = ()) -> Runtime:
    """Load plugins, check the platforms' settings sections, select the platform named by ``config.backend`` and
    resolve its backends. This is the only place hooks are called; the engine keeps the result, whose
    ``config`` carries the validated platform settings."""
    registry = build_registry(
        allow=config.plugins, strict=config.strict_plugins, extra_plugins=list(extra_plugins)
    )
    config = bind_settings(config, registry.platforms)  # platform sections: validated, defaults filled in
    while True:  # a plugin whose op hooks fail is dropped (reported) and the choice made again
        platform = select_platform(registry, config.backend)
        try:
            return Runtime(config, registry, platform, resolve_backends(registry, platform, config))
        except PluginHookError as exc:
            registry.drop(exc.plugin, str(exc))
