"""``deepinfer plugins``: what is installed, what each plugin implements, what can run here."""

from __future__ import annotations

import argparse
import json

from deepinfer_core.cli.settings_view import print_settings, settings_report
from deepinfer_core.config import load_config
from deepinfer_core.platforms.settings import bind_settings
from deepinfer_core.plugins.manager import implemented_hooks
from deepinfer_core.runtime import build_registry
from deepinfer_core.version import PLUGIN_API_VERSION, __version__


def collect(config_file: str | None = None, settings: bool = False) -> dict:
    """What ``deepinfer plugins`` prints; with ``settings``, also the effective settings and their sources."""
    cfg = load_config(config_file)
    reg = build_registry(allow=cfg.plugins, strict=cfg.strict_plugins)
    cfg = bind_settings(cfg, reg.platforms)
    avail = reg.availability()
    plugins = []
    for plugin_name, plugin in reg.pm.list_name_plugin():
        loaded = next((p for p in reg.report.loaded if p.name == plugin_name), None)
        dist, version = (
            (loaded.dist, loaded.version) if loaded else ("deepinfer-core (built-in)", __version__)
        )
        owned = [n for n, owner in reg.platforms.owners.items() if owner == plugin_name]
        plugins.append(
            {
                "name": plugin_name,
                "distribution": dist,
                "version": version,
                "hooks": implemented_hooks(reg.pm, plugin),
                "platforms": {
                    n: {
                        "available": avail[n].available,
                        "detail": avail[n].reason,
                        "priority": reg.platforms[n].priority,
                    }
                    for n in owned
                },
                "proposers": [n for n, o in reg.proposers.owners.items() if o == plugin_name],
                "structured_backends": [
                    n for n, o in reg.structured_backends.owners.items() if o == plugin_name
                ],
                "models": [n for n, o in reg.models.owners.items() if o == plugin_name],
            }
        )
    failed = [
        {"name": f.name, "distribution": f.dist, "version": f.version, "error": f.error}
        for f in reg.report.failed
    ]
    auto = max((reg.platforms[n] for n, a in avail.items() if a.available), key=lambda p: p.priority).name
    info = {
        "core_version": __version__,
        "plugin_api": PLUGIN_API_VERSION,
        "plugins": plugins,
        "failed": failed,
        "auto": auto,
    }
    if settings:
        info["settings"] = settings_report(cfg, config_file)
    return info


def run(ns: argparse.Namespace) -> int:
    info = collect(ns.config or None, settings=ns.config is not None)
    if ns.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"deepinfer-core {info['core_version']} (plugin API {info['plugin_api']})")
    for p in info["plugins"]:
        print(f"\n{p['distribution']} {p['version']}  [entry point: {p['name']}]")
        print(f"  hooks: {', '.join(p['hooks']) or '-'}")
        for name, a in p["platforms"].items():
            state = "available" if a["available"] else "unavailable"
            print(f"  platform {name} (priority {a['priority']}): {state} - {a['detail']}")
        for key in ("proposers", "structured_backends", "models"):
            if p[key]:
                print(f"  {key.replace('_', ' ')}: {', '.join(p[key])}")
    for f in info["failed"]:
        print(f"\nFAILED {f['distribution']} {f['version']} [entry point: {f['name']}]: {f['error']}")
    print(f"\nbackend=auto selects: {info['auto']}")
    if "settings" in info:
        print_settings(info["settings"])
    return 0
