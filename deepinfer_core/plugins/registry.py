"""Resolve hooks once into plain objects: platforms, backends, proposers, grammar backends, models.

A plugin is called through pluggy's hook callers one plugin at a time (a subset caller that leaves out
the others), so a plugin that raises, exits, or registers a name that is already taken is identified,
reported in ``report.failed`` and dropped whole, and the others are unaffected (unless
``strict_plugins``). The core's built-in plugin registers first, so its names win.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from deepinfer_core.ops.fusions import declared_fusions
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.platforms.base import Availability, Platform
from deepinfer_core.plugins.manager import LoadedPlugin, LoadReport, PluginLoadError, make_plugin_manager

if TYPE_CHECKING:
    from deepinfer_core.config import EngineConfig
    from deepinfer_core.ops.backends import Backends

log = logging.getLogger("deepinfer.plugins")


class BackendSelectionError(ValueError):
    """The configured ``backend`` cannot be used; the message lists what is installed and why."""


class PluginHookError(RuntimeError):
    """A plugin's hook failed; ``plugin`` names it (the engine drops that plugin and carries on)."""

    def __init__(self, plugin: str, message: str):
        super().__init__(message)
        self.plugin = plugin


class NamedRegistry(dict):
    """``name -> object`` where an object may be registered as ``"module:attr"`` and imported on first use."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.owners: dict[str, str] = {}

    def add(self, name: str, obj: Any, owner: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name {name!r} must be a non-empty string")
        if name in self:
            raise ValueError(
                f"{self.kind} {name!r} is registered twice: by {self.owners[name]} and by {owner}"
            )
        self[name] = obj
        self.owners[name] = owner

    def drop_owner(self, owner: str) -> None:
        for name in [n for n, o in self.owners.items() if o == owner]:
            del self.owners[name]
            dict.pop(self, name)

    def __getitem__(self, name: str) -> Any:
        obj = super().__getitem__(name)
        if isinstance(obj, str) and ":" in obj:
            mod, attr = obj.split(":", 1)
            obj = getattr(importlib.import_module(mod), attr)
            super().__setitem__(name, obj)
        return obj


@dataclass
class PluginRegistry:
    pm: pluggy.PluginManager
    report: LoadReport
    strict: bool = False
    platforms: NamedRegistry = field(default_factory=lambda: NamedRegistry("platform"))
    proposers: NamedRegistry = field(default_factory=lambda: NamedRegistry("proposer"))
    structured_backends: NamedRegistry = field(
        default_factory=lambda: NamedRegistry("structured-output backend")
    )
    models: NamedRegistry = field(default_factory=lambda: NamedRegistry("model architecture"))

    def availability(self) -> dict[str, Availability]:
        return {name: _probe(p) for name, p in self.platforms.items()}

    def tables(self) -> list[tuple[str, NamedRegistry]]:
        return [
            ("deepinfer_register_platforms", self.platforms),
            ("deepinfer_register_proposers", self.proposers),
            ("deepinfer_register_structured_backends", self.structured_backends),
            ("deepinfer_register_models", self.models),
        ]

    def call_one(self, hook_name: str, plugin_name: str, **kwargs: Any) -> Any:
        """Call ``hook_name`` of one plugin only, through pluggy; any failure (``SystemExit`` included)
        becomes a :class:`PluginHookError` naming the plugin."""
        others = [p for p in self.pm.get_plugins() if self.pm.get_name(p) != plugin_name]
        caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
        try:
            return caller(**kwargs)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - contained, reported by the caller
            raise PluginHookError(plugin_name, f"{hook_name} raised {type(exc).__name__}: {exc}") from exc

    def implementers(self, hook_name: str) -> list[str]:
        """Plugins implementing ``hook_name``, in pluggy's call order."""
        hook = getattr(self.pm.hook, hook_name)
        return [impl.plugin_name for impl in reversed(hook.get_hookimpls())]

    def drop(self, plugin_name: str, why: str) -> None:
        """Report ``plugin_name`` as failed and remove it and everything it registered (or raise, when
        ``strict_plugins``)."""
        if self.strict:
            raise PluginLoadError(f"plugin {plugin_name!r} failed: {why}")
        log.warning("deepinfer: plugin %r failed and is skipped: %s", plugin_name, why)
        loaded = next((p for p in self.report.loaded if p.name == plugin_name), None)
        if loaded is not None:
            self.report.loaded.remove(loaded)
        item = loaded or LoadedPlugin(plugin_name, "?", "?", None)
        self.report.failed.append(LoadedPlugin(item.name, item.dist, item.version, None, why))
        for _, table in self.tables():
            table.drop_owner(plugin_name)
        plugin = self.pm.get_plugin(plugin_name)
        if plugin is not None:
            self.pm.unregister(plugin)


def load_registry(
    builtin: object,
    allow: list[str] | None = None,
    strict: bool = False,
    extra_plugins: list[object] = (),
    entry_points=None,
) -> PluginRegistry:
    """Load plugins (see :func:`make_plugin_manager`) plus ``builtin``, the core's own plugin (handed in by
    :func:`deepinfer_core.runtime.build_registry`, which sits above both), and call every registration hook
    once, one plugin at a time, the built-in plugin first. A plugin whose registration raises or takes a name
    already registered is dropped whole and reported."""
    pm, report = make_plugin_manager(allow, strict, [builtin, *extra_plugins], entry_points)
    reg = PluginRegistry(pm, report, strict)
    names = [pm.get_name(p) for p in pm.get_plugins()]
    first = pm.get_name(builtin)
    for plugin_name in [first] + sorted(n for n in names if n != first):
        try:
            _register_all(reg, plugin_name)
        except PluginHookError as exc:
            reg.drop(plugin_name, str(exc))
    return reg


def _register_all(reg: PluginRegistry, plugin_name: str) -> None:
    """Run one plugin's registration hooks; on any failure undo what it registered and raise."""
    try:
        for hook_name, table in reg.tables():
            if plugin_name not in reg.implementers(hook_name):
                continue
            if table is reg.platforms:
                add = lambda p, _t=table: _t.add(getattr(p, "name", None), p, plugin_name)  # noqa: E731
            else:
                add = lambda n, obj, _t=table: _t.add(n, obj, plugin_name)  # noqa: E731
            reg.call_one(hook_name, plugin_name, register=add)
    except PluginHookError:
        for _, table in reg.tables():
            table.drop_owner(plugin_name)
        raise


def _probe(p: Platform) -> Availability:
    try:
        return p.is_available()
    except Exception as exc:  # noqa: BLE001 - a probe must never take the engine down
        return Availability(False, f"availability probe raised {type(exc).__name__}: {exc}")


def select_platform(reg: PluginRegistry, name: str) -> Platform:
    """``"auto"``: the available platform with the highest priority. Otherwise the named one, which must
    be installed and available; the error lists every installed platform and why each unavailable one is."""
    avail = reg.availability()
    if name == "auto":
        ok = [reg.platforms[n] for n, a in avail.items() if a.available]
        return max(ok, key=lambda p: (p.priority, p.name == "reference"))
    if name not in reg.platforms:
        raise BackendSelectionError(f"backend {name!r} is not installed. {_installed_summary(reg, avail)}")
    if not avail[name].available:
        raise BackendSelectionError(
            f"backend {name!r} is installed but unavailable: {avail[name].reason}. {_installed_summary(reg, avail)}"
        )
    return reg.platforms[name]


def _installed_summary(reg: PluginRegistry, avail: dict[str, Availability]) -> str:
    parts = []
    for n in sorted(avail):
        a = avail[n]
        parts.append(f"{n} (available)" if a.available else f"{n} (unavailable: {a.reason})")
    text = "Installed platforms: " + ", ".join(parts) + "."
    if reg.report.failed:
        text += " Plugins that failed to load: " + "; ".join(
            f"{f.name} from {f.dist}: {f.error}" for f in reg.report.failed
        )
    return text


def _check_fusions(plugin_name: str, concern: str, ops: object) -> None:
    """A declared fusion that is unknown, of another concern or not implemented is the plugin's fault."""
    try:
        declared_fusions(concern, ops)
    except ValueError as exc:
        raise PluginHookError(plugin_name, f"deepinfer_{concern}_ops: {exc}") from exc


def resolve_backends(reg: PluginRegistry, platform: Platform, config: EngineConfig) -> Backends:
    """Call each op hook once for ``platform``, plugin by plugin in pluggy's order until one answers;
    concerns nobody serves get the reference ops. The fused steps are resolved with them
    (:attr:`Backends.fused <deepinfer_core.ops.backends.Backends>`), once.

    :raises PluginHookError: naming the plugin whose op hook, or whose platform's ``finalize``, failed."""
    from deepinfer_core.ops.backends import CONCERNS, Backends

    objs: dict[str, Any] = {}
    for concern in CONCERNS:
        hook_name = f"deepinfer_{concern}_ops"
        obj = None
        for plugin_name in reg.implementers(hook_name):
            obj = reg.call_one(hook_name, plugin_name, platform=platform.name, config=config)
            if obj is not None:
                _check_fusions(plugin_name, concern, obj)
                break
        objs[concern] = obj if obj is not None else reference_op(concern)
    backends = Backends(platform=platform.name, **objs)
    try:
        platform.finalize(backends, config)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the platform's plugin is at fault
        owner = reg.platforms.owners.get(platform.name, "?")
        raise PluginHookError(
            owner, f"platform {platform.name!r} finalize raised {type(exc).__name__}: {exc}"
        ) from exc
    return backends
