"""The server is the top layer: nothing below it imports it, and it imports no device library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .test_plugin_api_boundary import imported_modules

ROOT = Path(__file__).resolve().parents[2] / "deepinfer_core"
TOP = ("serve", "cli")


def test_nothing_below_the_server_imports_it():
    bad = []
    for f in ROOT.rglob("*.py"):
        if f.relative_to(ROOT).parts[0] in TOP:
            continue
        bad += [
            f"{f.relative_to(ROOT)} imports {m}"
            for m in imported_modules(f)
            if m.startswith("deepinfer_core.serve")
        ]
    assert not bad, "\n".join(bad)


def test_the_server_imports_only_the_core_below_it():
    allowed = (
        "deepinfer_core.serve",
        "deepinfer_core.engine",
        "deepinfer_core.chat",
        "deepinfer_core.config",
        "deepinfer_core.sampling_params",
    )
    bad = []
    for f in (ROOT / "serve").rglob("*.py"):
        for m in imported_modules(f):
            if m.startswith("deepinfer_core") and not m.startswith(allowed):
                bad.append(f"{f.relative_to(ROOT)} imports {m}")
    assert not bad, "\n".join(bad)


def test_the_cli_runs_without_the_serve_extra():
    """A core-only install has no FastAPI, uvicorn or prometheus_client: the CLI still starts, and
    ``deepinfer serve`` says which extra to install."""
    block = "import sys\nfor m in ('fastapi', 'uvicorn', 'starlette', 'prometheus_client'): sys.modules[m] = None\n"
    code = block + "from deepinfer_core.cli.main import main\nsys.exit(main(['serve', '--port', '0']))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and 'pip install "deepinfer-core[serve]"' in r.stderr, r.stderr
