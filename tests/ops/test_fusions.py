"""Fusions are capabilities: a backend declares the fused ops it has, the table of fused steps is resolved
once (its method where declared, the core's composition of its plain ops otherwise), a wrong declaration
is refused naming it, and an op written without a newer keyword is adapted once, at resolution."""

from __future__ import annotations

import ast
import textwrap
from functools import partial
from pathlib import Path

import pytest
import torch

from deepinfer_core.ops import compose
from deepinfer_core.ops.adapt import adapt_attention
from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.fusions import Fusion, resolve_fusions
from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.reference import ReferenceAttentionOps, ReferenceDenseOps, reference_op

ROOT = Path(__file__).resolve().parents[2]


class _FusedPreNorm(ReferenceDenseOps):
    fusions = frozenset({Fusion.HC_PRE_NORM})

    def __init__(self) -> None:
        self.calls = 0

    def hc_pre_norm(self, x, hc, weight):
        self.calls += 1
        return compose.compose_hc_pre_norm(self, x, hc, weight)


def _backends(**ops) -> Backends:
    return Backends("reference", **{c: ops.get(c, reference_op(c)) for c in CONCERNS})


def test_a_backend_that_declares_nothing_gets_the_core_compositions():
    dense, attention = ReferenceDenseOps(), ReferenceAttentionOps()
    fused = resolve_fusions(dense, attention)
    assert fused.declared == frozenset()
    for fusion in Fusion:
        step = getattr(fused, fusion.value)
        assert isinstance(step, partial) and step.args[0] is (
            attention if fusion.concern == "attention" else dense
        )


def test_a_declared_fusion_is_the_backends_own_method_and_composed_steps_use_it():
    dense = _FusedPreNorm()
    fused = _backends(dense=dense).fused
    assert fused.declared == {Fusion.HC_PRE_NORM} and fused.hc_pre_norm == dense.hc_pre_norm
    g = torch.Generator().manual_seed(0)
    n, d = 2, 8
    hc = HCParams(torch.randn((2 + n) * n, n * d, generator=g) * 0.1, torch.randn((2 + n) * n, generator=g),
                  torch.ones(3), 3, 1e-6, 1e-6)  # fmt: skip
    x, w = torch.randn(3, n, d, generator=g), torch.ones(d)
    post, comb = torch.ones(3, n), torch.softmax(torch.randn(3, n, n, generator=g), -1)
    h, *entry = fused.hc_post_pre(x[:, 0], x, post, comb, hc, w)  # composed: hc_post, then the declared entry
    assert dense.calls == 1
    want = compose.compose_hc_post_pre(ReferenceDenseOps(), x[:, 0], x, post, comb, hc, w)
    for a, b in zip((h, *entry), want):
        assert torch.equal(a, b)


class _FusedNormRope(ReferenceDenseOps):
    fusions = frozenset({Fusion.RMS_NORM_ROPE})

    def __init__(self) -> None:
        self.calls = 0

    def rms_norm_rope(self, x, weight, eps, positions, inv_freq):
        self.calls += 1
        return compose.compose_rms_norm_rope(self, x, weight, eps, positions, inv_freq)


def test_steps_composed_over_a_declared_norm_rope_use_it():
    """``fusions.OVER_STEPS``: a backend that fuses ``rms_norm_rope`` but not the larger steps containing it (the
    KV row's store, the attention step's query) gets their compositions over its own fused norm-rope."""
    dense = _FusedNormRope()
    fused = _backends(dense=dense).fused
    g = torch.Generator().manual_seed(1)
    t, d, r = 3, 16, 8
    x, w, pos = torch.randn(t, d, generator=g), torch.rand(d, generator=g) + 0.5, torch.tensor([0, 7, 300])
    freq = 1.0 / 10000 ** (torch.arange(0, r, 2).float() / r)
    pool, slots = torch.zeros(5, d), torch.tensor([4, 0, 2])
    fused.rms_norm_rope_store_kv(x, w, 1e-6, pos, freq, pool, slots, None)
    assert dense.calls == 1
    assert torch.equal(
        pool[slots], compose.compose_rms_norm_rope(ReferenceDenseOps(), x[:, None], w, 1e-6, pos, freq)[:, 0]
    )
    q, kv = torch.randn(t, 2, d, generator=g), torch.randn(6, d, generator=g)
    kv_slots, sinks = torch.randint(0, 6, (t, 4), generator=g), torch.zeros(2)
    got = fused.rope_sparse_attention_unrope(
        q, kv, kv_slots, None, None, sinks, 0.25, pos, freq, q_norm_eps=1e-6
    )
    assert dense.calls == 2
    want = compose.compose_rope_sparse_attention_unrope(
        ReferenceAttentionOps(), q, kv, kv_slots, None, None, sinks, 0.25, pos, freq, dense=ReferenceDenseOps(),
        q_norm_eps=1e-6,
    )  # fmt: skip
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "declared, needle",
    [
        ({"rms_norm_rope_v2"}, "lists 'rms_norm_rope_v2', not a fusion"),
        ({Fusion.INDEXER_SELECT}, "lists 'indexer_select', which attention ops declare"),
        ({Fusion.LINEAR_F32}, "declares the fusion 'linear_f32' but has no such method"),
    ],
)
def test_a_wrong_declaration_is_refused_naming_it(declared, needle):
    wrong = type("WrongDense", (ReferenceDenseOps,), {"fusions": frozenset(declared)})()
    with pytest.raises(ValueError, match=needle):
        resolve_fusions(wrong, ReferenceAttentionOps())


def test_a_plugin_declaring_a_fusion_it_lacks_is_dropped_naming_it(tmp_path, monkeypatch):
    (tmp_path / "lacking_fusion_plugin.py").write_text(textwrap.dedent('''
        from deepinfer_core.plugin_api import Availability, Fusion, Platform, hookimpl, reference_op

        DEEPINFER_PLUGIN_API = "2.0"

        class Lacking(Platform):
            name = "lacking"
            def is_available(self):
                return Availability(True, "declares a fusion it does not have")

        class Dense(type(reference_op("dense"))):
            fusions = frozenset({Fusion.HC_POST_PRE})

        @hookimpl
        def deepinfer_register_platforms(register):
            register(Lacking())

        @hookimpl
        def deepinfer_dense_ops(platform, config):
            return Dense() if platform == "lacking" else None
    '''))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    import lacking_fusion_plugin

    from deepinfer_core.config import load_config
    from deepinfer_core.plugins.manager import PluginLoadError
    from deepinfer_core.runtime import build_runtime

    with pytest.raises(PluginLoadError, match="lacking_fusion_plugin.*'hc_post_pre' but has no such method"):
        build_runtime(
            load_config(environ={}, backend="lacking", strict_plugins=True), [lacking_fusion_plugin]
        )


def test_a_method_named_like_a_fusion_but_not_declared_is_not_called_and_is_reported(caplog):
    undeclared = type("Undeclared", (ReferenceDenseOps,), {"rms_norm_rope": lambda self, *a: 1 / 0})()
    fused = resolve_fusions(undeclared, ReferenceAttentionOps())
    assert isinstance(fused.rms_norm_rope, partial)
    assert "does not list it in its fusions" in caplog.text


class _OldSparse(ReferenceAttentionOps):
    """``sparse_attention`` as written before the FP8 KV cache: no ``kv_format``."""

    def sparse_attention(self, q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale):
        return super().sparse_attention(q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale)


def test_an_op_without_a_newer_keyword_is_adapted_once_at_resolution():
    old = _OldSparse()
    _backends(attention=old)
    q, pool = torch.randn(2, 2, 8), torch.randn(5, 8)
    slots = torch.tensor([[0, 1], [2, -1]])
    args = (q, pool, slots, None, None, torch.zeros(2), 0.5)
    assert torch.equal(
        old.sparse_attention(*args, kv_format=None), ReferenceAttentionOps().sparse_attention(*args)
    )
    with pytest.raises(TypeError, match="takes no 'kv_format'"):
        old.sparse_attention(*args, kv_format=object())
    adapted = old.sparse_attention
    adapt_attention(old)  # the current contract's signature is left alone, and an adapted one too
    assert old.sparse_attention is adapted


def test_model_code_never_asks_which_ops_a_backend_has():
    """No plugin API version, no ``hasattr`` / ``getattr`` probing of the ops in the models' source."""
    bad = []
    for f in (ROOT / "deepinfer_core/models").rglob("*.py"):
        text = f.read_text()
        if "plugin API" in text or "API 1." in text:
            bad.append(f"{f.relative_to(ROOT)} names a plugin API version")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr":
                bad.append(f"{f.relative_to(ROOT)}:{node.lineno} probes with hasattr")
    assert not bad, "\n".join(bad)
