"""Nothing reads the environment but the configuration: every setting is a typed field (the engine's, or a
platform's section), so a grep of the core's and the plugins' source finds ``os.environ`` / ``os.getenv`` only
in ``deepinfer_core/config.py`` and in the few places below, each for variables the engine does not own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "deepinfer_core", ROOT / "plugins", ROOT / "examples"]
#: file -> the variables it may touch, and why they are not settings
EXCEPTIONS = {
    # torchrun's contract: it sets these for each process it launches; the launcher also tells gloo and NCCL
    # which interface to use (writes, for those libraries)
    "deepinfer_core/distributed/launcher.py": {
        "RANK",
        "WORLD_SIZE",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
    },
    "deepinfer_core/distributed/ep.py": {"LOCAL_WORLD_SIZE"},  # torchrun's processes per host
    # Triton's own switch, fixed before any kernel is defined: the plugin must agree with Triton on it
    "plugins/deepinfer_cuda_sm100/deepinfer_cuda_sm100/dispatch.py": {"TRITON_INTERPRET"},
    "plugins/deepinfer_cuda_sm100/deepinfer_cuda_sm100/kernels/_common.py": {"TRITON_INTERPRET"},
}


def environment_uses(path: Path) -> list[tuple[int, str]]:
    """``(line, source line)`` of every ``os.environ`` / ``os.getenv`` / ``os.putenv`` and ``from os import
    environ`` in ``path``."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "environb", "getenv", "putenv", "unsetenv")
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in ("environ", "getenv", "environb") for a in node.names)
        ):
            out.append((node.lineno, lines[node.lineno - 1].strip()))
    return out


def test_only_the_configuration_reads_the_environment():
    bad = []
    for root in SOURCES:
        for f in root.rglob("*.py"):
            rel = f.relative_to(ROOT).as_posix()
            if rel == "deepinfer_core/config.py" or "/build/" in rel:
                continue
            allowed = EXCEPTIONS.get(rel, set())
            for lineno, line in environment_uses(f):
                if not any(f'"{name}"' in line for name in allowed):
                    bad.append(f"{rel}:{lineno}: {line}")
    assert not bad, "read a setting through EngineConfig or the platform's section instead:\n" + "\n".join(
        bad
    )


def test_the_check_sees_every_form_of_environment_access(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom os import getenv\na = os.environ['X']\nb = os.getenv('Y')\n")
    assert [n for n, _ in environment_uses(probe)] == [2, 3, 4]
