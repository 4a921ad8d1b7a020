"""A broken plugin is contained: one that takes a name already registered, raises in a registration or op
hook, or calls ``sys.exit`` at import is reported (name and reason) and skipped whole, and ``LLM()`` still
builds and generates. ``strict_plugins=True`` makes each of them fatal instead."""

from __future__ import annotations

import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.config import load_config
from deepinfer_core.plugins.manager import PluginLoadError
from deepinfer_core.runtime import build_runtime

from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf

HEAD = """
import sys
from deepinfer_core.plugin_api import Availability, Platform, hookimpl
DEEPINFER_PLUGIN_API = "2.0"
class P(Platform):
    name = "{name}"
    priority = 1000  # would win "auto" if it were kept
    device_type = "cpu"
    def is_available(self):
        return Availability(True, "always")
"""

CASES = {
    "takes-reference": HEAD.format(name="reference")
    + "@hookimpl\ndef deepinfer_register_platforms(register):\n    register(P())\n",
    "raises-registering": HEAD.format(name="shaky")
    + "@hookimpl\ndef deepinfer_register_platforms(register):\n    register(P())\n"
    + "@hookimpl\ndef deepinfer_register_models(register):\n    raise RuntimeError('registry on fire')\n",
    "raises-in-ops": HEAD.format(name="opsfail")
    + "@hookimpl\ndef deepinfer_register_platforms(register):\n    register(P())\n"
    + "@hookimpl\ndef deepinfer_dense_ops(platform, config):\n"
    + "    if platform == 'opsfail':\n        raise RuntimeError('no device here')\n",
    "exits-at-import": "import sys\nsys.exit(3)\n",
    "takes-grammar-name": HEAD.format(name="gram")
    + "@hookimpl\ndef deepinfer_register_structured_backends(register):\n"
    + "    register('xgrammar', object())\n",
}
REASONS = {
    "takes-reference": "platform 'reference' is registered twice",
    "raises-registering": "registry on fire",
    "raises-in-ops": "no device here",
    "exits-at-import": "SystemExit: 3",
    "takes-grammar-name": "structured-output backend 'xgrammar' is registered twice",
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("contain")
    build_hf(Schedule("contain", (CSA, HCA)), seed=4).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_plugin_is_reported_and_skipped_and_the_engine_runs(fake_dist, ckpt, case):
    ep = case.replace("-", "_")
    fake_dist(f"deepinfer-{case}", f"mod_{ep}", CASES[case], ep)
    plugins = [ep, "structured"]
    llm = LLM(ckpt, kv_cache_memory_bytes=16 << 20, max_model_len=64, plugins=plugins)
    assert llm.backend_name == "reference"
    out = llm.generate([{"prompt_token_ids": [3, 4, 5]}], SamplingParams(max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    rt = build_runtime(load_config(plugins=plugins))
    [failed] = [f for f in rt.registry.report.failed if f.name == ep]
    assert REASONS[case] in failed.error
    assert ep not in [p.name for p in rt.registry.report.loaded]
    assert all(
        owner != ep
        for table in (rt.registry.platforms, rt.registry.models)
        for owner in table.owners.values()
    )
    if case == "takes-grammar-name":
        assert rt.registry.structured_backends.owners["xgrammar"] == "structured"


@pytest.mark.parametrize("case", sorted(CASES))
def test_strict_plugins_makes_a_broken_plugin_fatal(fake_dist, case):
    ep = "strict_" + case.replace("-", "_")
    fake_dist(f"deepinfer-s-{case}", f"mod_{ep}", CASES[case], ep)
    with pytest.raises(PluginLoadError, match=REASONS[case].split("'")[0]):
        build_runtime(load_config(plugins=[ep, "structured"], strict_plugins=True))


def test_a_plugin_named_explicitly_whose_ops_fail_gives_an_error_naming_why(fake_dist):
    fake_dist("deepinfer-opsfail2", "mod_opsfail2", CASES["raises-in-ops"], "opsfail2")
    with pytest.raises(ValueError, match=r"backend 'opsfail' is not installed.*no device here"):
        build_runtime(load_config(plugins=["opsfail2"], backend="opsfail"))
