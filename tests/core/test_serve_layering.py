"""The server is the top layer (``test_import_layers`` checks that nothing below imports it): it uses only the
engine, the chat encoding and the settings, and the CLI runs without its optional dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "deepinfer_core"


def imported_modules(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


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
