"""Developer and CI sessions: ``nox -s lint tests demo`` (``tests`` runs the conformance kit too; ``conformance``
runs only the kit).

Torch is pinned to the CPU build first (``TORCH_SPEC``) so that no dependency range pulls a CUDA build.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "tests", "demo"]
nox.options.reuse_existing_virtualenvs = True

TORCH_SPEC = os.environ.get("DEEPINFER_TORCH_SPEC", "torch==2.13.0")
PLUGINS = [
    "plugins/deepinfer_cuda_sm100",
    "plugins/deepinfer_ascend950",
    "plugins/deepinfer_spec_decode",
    "plugins/deepinfer_structured",
    "examples/third_party_backend",
]


# Triton runs the NVIDIA plugin's kernels under its CPU interpreter in CI (TRITON_INTERPRET=1).
TRITON_SPEC = os.environ.get("DEEPINFER_TRITON_SPEC", "triton==3.9.0")


def install_all(session: nox.Session) -> None:
    """Torch's CPU build first, then the core, every plugin and Triton in one resolution (one pip run instead of
    seven: about 15 s less of CI)."""
    session.install(TORCH_SPEC)
    session.install("-e", ".[test]", *(a for p in PLUGINS for a in ("-e", p)), TRITON_SPEC)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite, with every plugin and the example backend installed, then (without arguments) the
    conformance kit against the example backend in the same environment. The suite runs in ``DEEPINFER_TEST_WORKERS`` processes (pytest-xdist,
    default 2: the reference platform computes on one thread, and CI has two cores), a test file per worker, in
    the order ``tests/conftest.py`` gives (the slowest files first); ``DEEPINFER_TEST_WORKERS=0`` runs it in one."""
    install_all(session)
    workers = os.environ.get("DEEPINFER_TEST_WORKERS", "2")
    spread = (
        ["-n", workers, "--dist", "loadfile", "--no-loadscope-reorder"] if workers not in ("0", "1") else []
    )
    # the slowest tests' times in CI's log, for keeping the run within its budget
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=30", *spread, *session.posargs
    )
    if not session.posargs:
        # the reference's own pass through every case is in the suite (tests/testing/test_conformance_kit.py)
        run_conformance_kit(session, ("example",))


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def run_conformance_kit(session: nox.Session, backends: tuple[str, ...] = ("reference", "example")) -> None:
    """The conformance kit as a backend's author runs it (``pytest --pyargs deepinfer_core.testing
    --deepinfer-backend NAME``), against the reference ops and the example third-party backend."""
    for backend in backends:
        session.run(
            "python",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--pyargs",
            "deepinfer_core.testing",
            "--deepinfer-backend",
            backend,
        )


@nox.session(default=False)
def conformance(session: nox.Session) -> None:
    """Only the conformance kit (``tests`` runs it after the suite, without another environment's install)."""
    install_all(session)
    run_conformance_kit(session)


@nox.session
def demo(session: nox.Session) -> None:
    """A fresh venv with only deepinfer-core: ``deepinfer plugins`` shows only ``reference``, and the
    quick-start generation runs on the CPU."""
    session.install(TORCH_SPEC)
    session.install(".")
    session.run("python", "tools/check_core_only.py")
    session.run("deepinfer", "generate", "def quicksort(xs):", "--max-tokens", "32", "--no-progress")
