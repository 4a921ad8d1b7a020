"""Resolve hooks once into plain objects: platforms, backends, proposers, grammar backends, models."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from deepinfer_core.platforms.base import Availability, Platform
from deepinfer_core.plugins.manager import LoadReport, make_plugin_manager

if TYPE_CHECKING:
    from deepinfer_core.config import EngineConfig
    from deepinfer_core.ops.backends import Backends


class BackendSelectionError(ValueError):
    """The configured ``backend`` cannot be used; the message lists what is installed and why."""


class NamedRegistry(dict):
    """``name -> object`` where an object may be registered as ``"module:attr"`` and imported on first use."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.owners: dict[str, str] = {}

    def add(self, name: str, obj: Any, owner: str) -> None:
        if name in self:
            raise ValueError(
                f"{self.kind} {name!r} is registered twice: by {self.owners[name]} and by {owner}"
            )
        self[name] = obj
        self.owners[name] = owner

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
    platforms: NamedRegistry = field(default_factory=lambda: NamedRegistry("platform"))
    proposers: NamedRegistry = field(default_factory=lambda: NamedRegistry("proposer"))
    structured_backends: NamedRegistry = field(
        default_factory=lambda: NamedRegistry("structured-output backend")
    )
    models: NamedRegistry = field(default_factory=lambda: NamedRegistry("model architecture"))

    def availability(self) -> dict[str, Availability]:
        return {name: _probe(p) for name, p in self.platforms.items()}


def build_registry(
    allow: list[str] | None = None, strict: bool = False, extra_plugins: list[object] = (), entry_points=None
) -> PluginRegistry:
    """Load plugins (see :func:`make_plugin_manager`) plus the core's built-in plugin and call every
    registration hook once."""
    from deepinfer_core import builtin

    pm, report = make_plugin_manager(allow, strict, [builtin, *extra_plugins], entry_points)
    reg = PluginRegistry(pm, report)
    for hook, table in (
        (pm.hook.deepinfer_register_platforms, reg.platforms),
        (pm.hook.deepinfer_register_proposers, reg.proposers),
        (pm.hook.deepinfer_register_structured_backends, reg.structured_backends),
        (pm.hook.deepinfer_register_models, reg.models),
    ):
        for impl in hook.get_hookimpls():
            owner = impl.plugin_name
            if table is reg.platforms:
                impl.function(register=lambda p, _o=owner, _t=table: _t.add(p.name, p, _o))
            else:
                impl.function(register=lambda n, obj, _o=owner, _t=table: _t.add(n, obj, _o))
    return reg


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


_REFERENCE = {
    "dense": "deepinfer_core.ops.reference.dense:ReferenceDenseOps",
    "attention": "deepinfer_core.ops.reference.attention:ReferenceAttentionOps",
    "moe": "deepinfer_core.ops.reference.moe:ReferenceMoEOps",
    "sampling": "deepinfer_core.ops.reference.sampling:ReferenceSamplingOps",
    "memory": "deepinfer_core.ops.reference.memory:ReferenceMemoryOps",
    "comm": "deepinfer_core.ops.reference.comm:ReferenceCommOps",
}


def reference_op(concern: str) -> Any:
    mod, attr = _REFERENCE[concern].split(":")
    return getattr(importlib.import_module(mod), attr)()


def resolve_backends(reg: PluginRegistry, platform: Platform, config: EngineConfig) -> Backends:
    """Call each op hook once for ``platform``; concerns nobody serves get the reference ops."""
    from deepinfer_core.ops.backends import CONCERNS, Backends

    objs: dict[str, Any] = {}
    for concern in CONCERNS:
        hook: Callable[..., Any] = getattr(reg.pm.hook, f"deepinfer_{concern}_ops")
        obj = hook(platform=platform.name, config=config)
        objs[concern] = obj if obj is not None else reference_op(concern)
    backends = Backends(platform=platform.name, **objs)
    platform.finalize(backends, config)
    return backends
