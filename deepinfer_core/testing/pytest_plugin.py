"""pytest plugin (entry point ``pytest11``): the ``--deepinfer-backend`` option of the conformance kit."""

from __future__ import annotations

import importlib

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("deepinfer", "DeepInfer conformance kit")
    group.addoption("--deepinfer-backend", default=None, help="platform whose ops the conformance kit checks")
    group.addoption(
        "--deepinfer-extra-plugin",
        action="append",
        default=[],
        help="import this module and register it as a DeepInfer plugin (for plugins not installed as entry points)",
    )


@pytest.fixture(scope="session")
def deepinfer_backend_name(request: pytest.FixtureRequest) -> str:
    name = request.config.getoption("--deepinfer-backend")
    if not name:
        pytest.skip("conformance kit: pass --deepinfer-backend NAME")
    return name


@pytest.fixture(scope="session")
def deepinfer_backends(request: pytest.FixtureRequest, deepinfer_backend_name: str):
    from deepinfer_core.testing.kit import backends_for

    extra = [importlib.import_module(m) for m in request.config.getoption("--deepinfer-extra-plugin")]
    return backends_for(deepinfer_backend_name, extra_plugins=extra)
