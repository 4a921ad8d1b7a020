"""The plugin-manager factory: load entry points of group ``deepinfer`` safely.

There is no module-level manager: :func:`make_plugin_manager` builds one per registry, so tests
and several engines in one process never share plugin state.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import types
from dataclasses import dataclass, field

import pluggy

from deepinfer_core.plugins import hookspecs
from deepinfer_core.plugins.markers import PROJECT
from deepinfer_core.version import PLUGIN_API_VERSION

ENTRY_POINT_GROUP = "deepinfer"
log = logging.getLogger("deepinfer.plugins")


class PluginLoadError(RuntimeError):
    """A plugin failed to load and ``strict_plugins=True`` asked for failures to be fatal."""


class UnknownPluginError(ValueError):
    """The ``plugins`` allow-list (``DEEPINFER_PLUGINS``) names a plugin that is not installed."""


@dataclass
class LoadedPlugin:
    name: str  # entry-point name
    dist: str  # distribution name (pip name)
    version: str
    module: object | None
    error: str | None = None  # why it did not load


@dataclass
class LoadReport:
    loaded: list[LoadedPlugin] = field(default_factory=list)
    failed: list[LoadedPlugin] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # filtered out by the allow-list


def api_compatible(declared: str | None) -> tuple[bool, str]:
    """Is a plugin built for API ``declared`` usable with this core's :data:`PLUGIN_API_VERSION`?"""
    if declared is None:
        return False, f"it does not declare DEEPINFER_PLUGIN_API (this core provides {PLUGIN_API_VERSION})"
    try:
        p_major, p_minor = (int(x) for x in str(declared).split(".")[:2])
        c_major, c_minor = (int(x) for x in PLUGIN_API_VERSION.split(".")[:2])
    except ValueError:
        return False, f"DEEPINFER_PLUGIN_API={declared!r} is not 'MAJOR.MINOR'"
    if p_major < c_major:
        return False, (
            f"it was built for plugin API {declared}; this core provides {PLUGIN_API_VERSION}, a new major "
            "version. Import only from deepinfer_core.plugin_api and declare DEEPINFER_PLUGIN_API = "
            f"'{c_major}.0' (docs/plugins.md has the changelog and what moved)"
        )
    if p_major != c_major or p_minor > c_minor:
        return False, (
            f"it was built for plugin API {declared}, this core provides {PLUGIN_API_VERSION} "
            f"(need the same major version and a minor version <= {c_minor})"
        )
    return True, ""


def make_plugin_manager(
    allow: list[str] | None = None,
    strict: bool = False,
    extra_plugins: list[object] = (),
    entry_points: list[md.EntryPoint] | None = None,
) -> tuple[pluggy.PluginManager, LoadReport]:
    """Build a plugin manager with the core's hook specs and every allowed entry point loaded.

    :param allow: entry-point names to load (``None``: all; ``[]``: none).
    :param strict: raise :class:`PluginLoadError` on the first plugin that fails to load.
    :param extra_plugins: plugin objects registered directly (tests, embedded use).
    :param entry_points: override discovery (tests); default is the ``deepinfer`` group.
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    report = LoadReport()
    eps = list(md.entry_points(group=ENTRY_POINT_GROUP)) if entry_points is None else entry_points
    unknown = sorted(set(allow or ()) - {ep.name for ep in eps})
    if unknown:
        installed = ", ".join(sorted({ep.name for ep in eps})) or "none"
        raise UnknownPluginError(
            f"plugins={allow!r} names {', '.join(repr(u) for u in unknown)}, which no installed plugin "
            f"is called; installed plugins: {installed} (the built-in reference platform needs no entry)"
        )
    for ep in sorted(eps, key=lambda e: e.name):
        if allow is not None and ep.name not in allow:
            report.skipped.append(ep.name)
            continue
        _load_one(pm, ep, strict, report)
    for plugin in extra_plugins:
        _register(pm, plugin, getattr(plugin, "__name__", repr(plugin)))
    pm.check_pending()  # a misspelled hook name is an error, not silence
    return pm, report


def _load_one(pm: pluggy.PluginManager, ep: md.EntryPoint, strict: bool, report: LoadReport) -> None:
    dist = ep.dist.name if ep.dist is not None else "?"
    version = ep.dist.version if ep.dist is not None else "?"
    try:
        obj = ep.load()
        ok, why = api_compatible(getattr(obj, "DEEPINFER_PLUGIN_API", None))
        if not ok:
            raise PluginLoadError(f"plugin {ep.name!r} from {dist} {version} is refused: {why}")
        _register(pm, obj, ep.name)
        _check_known_hooks(pm, pm.get_plugin(ep.name), ep.name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure (even sys.exit) is reported
        msg = exc.args[0] if isinstance(exc, PluginLoadError) else f"{type(exc).__name__}: {exc}"
        item = LoadedPlugin(ep.name, dist, version, None, msg)
        if strict:
            raise PluginLoadError(
                f"plugin {ep.name!r} (distribution {dist} {version}) failed to load: {msg}"
            ) from exc
        log.warning(
            "deepinfer: plugin %r (distribution %s %s) failed to load: %s", ep.name, dist, version, msg
        )
        report.failed.append(item)
        return
    report.loaded.append(LoadedPlugin(ep.name, dist, version, obj))


def _check_known_hooks(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Refuse a plugin that implements a hook no spec declares (usually a misspelling)."""
    unknown = sorted(
        hook_name
        for hook_name, caller in vars(pm.hook).items()
        if isinstance(caller, pluggy.HookCaller)
        and caller.spec is None
        and any(impl.plugin is plugin and not impl.optionalhook for impl in caller.get_hookimpls())
    )
    if unknown:
        pm.unregister(plugin)
        raise PluginLoadError(
            f"plugin {name!r} implements unknown hook(s) {', '.join(unknown)} (misspelled?)"
        )


def _register(pm: pluggy.PluginManager, obj: object, name: str) -> None:
    if isinstance(obj, type) and not isinstance(obj, types.ModuleType):
        obj = obj()  # a class: register an instance
    pm.register(obj, name=name)


def implemented_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    """Names of the hooks ``plugin`` implements (for ``deepinfer plugins``)."""
    return sorted(h.name for h in (pm.get_hookcallers(plugin) or []))
