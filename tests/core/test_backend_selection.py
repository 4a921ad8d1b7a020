"""Backend selection by config: auto, explicit names, unavailable platforms, the example plugin."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from deepinfer_core.config import load_config
from deepinfer_core.plugins.registry import BackendSelectionError, select_platform
from deepinfer_core.runtime import build_registry

installed = {ep.name for ep in md.entry_points(group="deepinfer")}
needs_plugins = pytest.mark.skipif(
    not {"cuda_sm100", "ascend950", "example"} <= installed,
    reason="plugins not installed (run through nox -s tests)",
)


def test_auto_is_reference_without_accelerators():
    assert select_platform(build_registry(), "auto").name == "reference"


def test_unknown_backend_lists_installed_platforms_and_why_unavailable():
    with pytest.raises(BackendSelectionError) as e:
        select_platform(build_registry(), "no_such_backend")
    msg = str(e.value)
    assert "'no_such_backend' is not installed" in msg and "reference (available)" in msg
    if "cuda_sm100" in installed:
        assert "cuda_sm100 (unavailable:" in msg


@needs_plugins
def test_cuda_backend_on_a_cpu_machine_says_why():
    with pytest.raises(BackendSelectionError, match=r"'cuda_sm100' is installed but unavailable: .*CUDA"):
        select_platform(build_registry(), "cuda_sm100")


@needs_plugins
def test_ascend_backend_without_torch_npu_says_why():
    with pytest.raises(BackendSelectionError, match=r"'ascend950' is installed but unavailable: torch_npu"):
        select_platform(build_registry(), "ascend950")


@needs_plugins
def test_auto_stays_reference_with_every_plugin_installed():
    reg = build_registry()
    assert {"reference", "cuda_sm100", "ascend950", "example"} <= set(reg.platforms)
    assert select_platform(reg, "auto").name == "reference"


@needs_plugins
def test_example_backend_replaces_its_ops_and_falls_back_for_the_rest():
    from deepinfer_core.runtime import build_runtime

    rt = build_runtime(load_config(backend="example"))
    desc = rt.backends.describe()
    assert desc["dense"] == "ExampleDenseOps" and desc["sampling"] == "ExampleSamplingOps"
    assert desc["attention"].startswith("Reference") and desc["moe"].startswith("Reference")


def test_a_probe_that_raises_is_reported_as_unavailable():
    from deepinfer_core import hookimpl
    from deepinfer_core.platforms.base import Platform

    class Exploding(Platform):
        name = "exploding"
        priority = 1000

        def is_available(self):
            raise OSError("driver crashed")

    class Plugin:
        @hookimpl
        def deepinfer_register_platforms(self, register):
            register(Exploding())

    reg = build_registry(allow=[], extra_plugins=[Plugin()])
    assert select_platform(reg, "auto").name == "reference"
    with pytest.raises(BackendSelectionError, match="probe raised OSError: driver crashed"):
        select_platform(reg, "exploding")


@needs_plugins
def test_a_plugin_built_for_an_older_api_samples_as_the_reference_does():
    """The example backend declares plugin API 2.0 and has no keyed draws of its own (2.8): the engine draws with
    the base class's, so its seeded samples equal the reference backend's, token for token."""
    from deepinfer_core import LLM, SamplingParams

    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=12) for s in (1, 2, 3)]
    outs = {}
    for backend in ("reference", "example"):
        llm = LLM(backend=backend, max_model_len=256, kv_cache_memory_bytes=16 << 20)
        assert type(llm.engine.sampler.ops).__name__.startswith(backend.capitalize())
        outs[backend] = [
            o.outputs[0].token_ids for o in llm.generate(["def f(x):"] * 3, params, use_tqdm=False)
        ]
    assert outs["example"] == outs["reference"]
    assert len({tuple(t) for t in outs["reference"]}) == 3  # the seeds differ, so do the samples
