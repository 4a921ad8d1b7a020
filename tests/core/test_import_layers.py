"""Imports inside ``deepinfer_core`` run downward only, read from the source: config and ops at the bottom,
then kv, then models (and the seams beside them), then the plugin machinery, then the engine, then the
public API and the CLI. No package imports one above it, and no two packages import each other."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "deepinfer_core"
#: a package may import its own and lower layers; packages on one layer must not import each other both ways
LAYERS = {
    "version": 0, "config": 0, "sampling_params": 0, "demo": 0,
    "ops": 1, "platforms": 1,
    "kv": 2,
    "models": 3, "structured": 3, "chat": 3, "spec_decode": 3,
    "plugins": 4, "plugin_api": 4, "runtime": 4, "builtin": 4, "distributed": 4,
    "engine": 5,
    "testing": 6, "evaluation": 6,
    "cli": 7, "serve": 7, "__init__": 8,
}  # fmt: skip


def _package(path: Path) -> str:
    head = path.relative_to(CORE).parts[0]
    return head[:-3] if head.endswith(".py") else head


def _edges() -> dict[tuple[str, str], str]:
    edges: dict[tuple[str, str], str] = {}
    for path in CORE.rglob("*.py"):
        src = _package(path)
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            for mod in mods:
                parts = mod.split(".")
                if parts[0] == "deepinfer_core" and len(parts) > 1 and parts[1] != src:
                    edges.setdefault((src, parts[1]), f"{path.relative_to(CORE.parent)}:{node.lineno}")
    return edges


def test_every_package_has_a_layer():
    packages = {_package(p) for p in CORE.rglob("*.py")}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def test_imports_run_downward_and_no_two_packages_import_each_other():
    edges = _edges()
    upward = [f"{a} -> {b} at {where}" for (a, b), where in edges.items() if LAYERS[b] > LAYERS[a]]
    both = [f"{a} <-> {b}: {w} / {edges[(b, a)]}" for (a, b), w in edges.items() if a < b and (b, a) in edges]
    assert not upward and not both, "\n".join(upward + both)


def test_the_package_graph_has_no_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in _edges():
        graph[a].add(b)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in list(graph):
        if node not in state:
            visit(node, [])
