"""The conformance kit catches wrong ops, both through check_case and through the pytest plugin."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from deepinfer_core.testing import all_cases, check_case

WRONG_PLUGIN = """
import torch
from deepinfer_core.plugin_api import Availability, Platform, hookimpl, reference_op

DEEPINFER_PLUGIN_API = "2.0"

class WrongPlatform(Platform):
    name = "wrong"
    priority = -100
    def is_available(self):
        return Availability(True, "deliberately wrong rms_norm")

class WrongDense(type(reference_op("dense"))):
    def rms_norm(self, x, weight, eps):
        y = super().rms_norm(x, weight, eps)
        return y * 1.001  # off by 0.1%: small, but far outside any tolerance

@hookimpl
def deepinfer_register_platforms(register):
    register(WrongPlatform())

@hookimpl
def deepinfer_dense_ops(platform, config):
    return WrongDense() if platform == "wrong" else None
"""


@pytest.fixture
def wrong_plugin(tmp_path, monkeypatch):
    (tmp_path / "wrong_backend_plugin.py").write_text(textwrap.dedent(WRONG_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # for pytester's subprocess (and the kit's gloo ranks)
    import importlib

    return importlib.import_module("wrong_backend_plugin")


def rms_cases():
    cases = [c for c in all_cases() if c.concern == "dense" and c.op == "rms_norm"]
    assert cases, "the kit has no rms_norm case"
    return cases


def test_check_case_passes_for_the_reference_itself():
    from deepinfer_core.testing.kit import backends_for

    ref = backends_for("reference")
    for case in all_cases():
        if case.applies_to(ref):
            check_case(ref, case)
    # the only feature the reference does not declare: graph capture
    assert {c.id for c in all_cases() if not c.applies_to(ref)} == {
        "memory.capture_graph[replay_redoes_writes]",
        "memory.capture_graph[after_a_released_graph]",
    }


def test_check_case_catches_a_wrong_op(wrong_plugin):
    from deepinfer_core.testing.kit import backends_for

    backends = backends_for("wrong", extra_plugins=[wrong_plugin])
    for case in rms_cases():
        with pytest.raises(AssertionError, match=r"dense\.rms_norm"):
            check_case(backends, case)


def test_pytest_plugin_reports_the_wrong_op(pytester, wrong_plugin):
    result = pytester.runpytest_subprocess(
        "--pyargs", "deepinfer_core.testing", "--deepinfer-backend", "wrong",
        "--deepinfer-extra-plugin", "wrong_backend_plugin", "-q", "-p", "no:cacheprovider",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    # the wrong rms_norm also breaks the composed ops whose defaults call it
    on_rms = ("rms_norm_rope", "hc_pre_norm", "hc_post_pre", "hc_site_norm", "hc_post_site_norm")
    composed = [c for c in all_cases() if c.concern == "dense" and c.op in on_rms]
    # and the attention steps that norm a row: the KV row's store, the attention step's normed query
    composed += [
        c
        for c in all_cases()
        if c.op == "rms_norm_rope_store_kv"
        or c.id == "attention.rope_sparse_attention_unrope[fp8_kv_cache_normed_query]"
    ]
    assert len(composed) == 9
    assert outcomes.get("failed", 0) == len(rms_cases()) + len(composed)
    assert outcomes.get("passed", 0) > 0
    result.stdout.fnmatch_lines(["*dense.rms_norm*"])


def test_kit_without_a_backend_option_skips_cleanly(pytester):
    result = pytester.runpytest_subprocess(
        "--pyargs", "deepinfer_core.testing", "-q", "-p", "no:cacheprovider"
    )
    assert result.parseoutcomes().get("skipped", 0) > 0
    assert torch  # the kit imports cleanly without a backend
