"""Fixtures that install throw-away plugin distributions on sys.path (real entry-point discovery)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``fake_dist(dist, module, source, ep_name)`` writes ``module.py`` and a ``.dist-info`` whose
    ``entry_points.txt`` puts ``ep_name = module`` in the ``deepinfer`` group, then puts it on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make(dist: str, module: str, source: str, ep_name: str, version: str = "9.9.9") -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[deepinfer]\n{ep_name} = {module}\n")
        made.append(module)
        importlib.invalidate_caches()

    yield make
    for m in made:
        sys.modules.pop(m, None)
    importlib.invalidate_caches()
