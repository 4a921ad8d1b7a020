"""Plugins depend only on the names of ``deepinfer_core.plugin_api``, never on core internals and never on
each other; the core never imports a plugin or a device library; ``docs/plugins.md`` lists the same names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import deepinfer_core.plugin_api as plugin_api

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_PACKAGES = {
    "deepinfer_cuda_sm100",
    "deepinfer_ascend950",
    "deepinfer_spec_decode",
    "deepinfer_structured",
    "deepinfer_example_backend",
}


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, imported names)`` of every absolute import in ``path`` (names empty for ``import x``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def plugin_sources() -> list[Path]:
    dirs = [
        *(ROOT / "plugins").glob("deepinfer_*/deepinfer_*"),
        ROOT / "examples/third_party_backend/deepinfer_example_backend",
    ]
    return [f for d in dirs for f in d.rglob("*.py")]


def test_plugins_import_only_names_of_the_plugin_api():
    allowed = set(plugin_api.__all__)
    bad = []
    for f in plugin_sources():
        own = next(p for p in f.parts if p in PLUGIN_PACKAGES)
        for mod, names in imports(f):
            top = mod.split(".")[0]
            where = f.relative_to(ROOT)
            if top == "deepinfer_core" and mod != "deepinfer_core.plugin_api":
                bad.append(f"{where} imports {mod}: plugins import only deepinfer_core.plugin_api")
            elif mod == "deepinfer_core.plugin_api":
                bad += [
                    f"{where} imports {n}, which is not in plugin_api.__all__"
                    for n in names
                    if n not in allowed
                ]
            elif top in PLUGIN_PACKAGES and top != own:
                bad.append(f"{where} imports another plugin, {mod}")
    assert not bad, "\n".join(bad)


def test_every_name_of_the_plugin_api_exists_and_is_documented():
    doc = (ROOT / "docs/plugins.md").read_text()
    listed = set(
        re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", doc.split("## The plugin API", 1)[1].split("\n## ", 1)[0])
    )
    for name in plugin_api.__all__:
        assert hasattr(plugin_api, name), name
    assert set(plugin_api.__all__) <= listed, sorted(set(plugin_api.__all__) - listed)


def test_core_never_imports_a_plugin_or_a_device_library():
    bad = []
    for f in (ROOT / "deepinfer_core").rglob("*.py"):
        for mod, _ in imports(f):
            top = mod.split(".")[0]
            if top in PLUGIN_PACKAGES | {"triton", "tilelang", "torch_npu", "xgrammar", "llguidance"}:
                bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)
