"""Plugins depend only on the core's public plugin API (docs/architecture.md), never on its internals,
and never on each other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = (
    "deepinfer_core",
    "deepinfer_core.config",
    "deepinfer_core.platforms.base",
    "deepinfer_core.ops",
    "deepinfer_core.plugins.registry",
    "deepinfer_core.structured",
    "deepinfer_core.spec_decode",
    "deepinfer_core.testing",
    "deepinfer_core.engine.forward_batch",
    "deepinfer_core.kv.spec",
    "deepinfer_core.kv.fp8",
    "deepinfer_core.models.base",
)
PLUGIN_PACKAGES = {
    "deepinfer_cuda_sm100",
    "deepinfer_ascend950",
    "deepinfer_spec_decode",
    "deepinfer_structured",
    "deepinfer_example_backend",
}


def imported_modules(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


def is_public(module: str) -> bool:
    return any(module == p or (p != "deepinfer_core" and module.startswith(p + ".")) for p in PUBLIC)


def test_plugins_import_only_the_public_plugin_api():
    bad = []
    for pkg_dir in [
        *(ROOT / "plugins").glob("deepinfer_*/deepinfer_*"),
        ROOT / "examples/third_party_backend/deepinfer_example_backend",
    ]:
        own = pkg_dir.name
        for f in pkg_dir.rglob("*.py"):
            for mod in imported_modules(f):
                top = mod.split(".")[0]
                if top == "deepinfer_core" and not is_public(mod):
                    bad.append(f"{f.relative_to(ROOT)} imports core internal {mod}")
                elif top in PLUGIN_PACKAGES and top != own:
                    bad.append(f"{f.relative_to(ROOT)} imports another plugin, {mod}")
    assert not bad, "\n".join(bad)


def test_core_never_imports_a_plugin_or_a_device_library():
    bad = []
    for f in (ROOT / "deepinfer_core").rglob("*.py"):
        for mod in imported_modules(f):
            top = mod.split(".")[0]
            if top in PLUGIN_PACKAGES | {"triton", "tilelang", "torch_npu", "xgrammar", "llguidance"}:
                bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)
