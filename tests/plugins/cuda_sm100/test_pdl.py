"""Programmatic dependent launch: every kernel opens with ``pdl_enter`` and every launch passes
``dispatch.pdl_args(tokens)``, which turns it on only where the PTX can run, for few-token kernels.

A kernel launched with ``launch_pdl`` that touched memory before ``griddepcontrol.wait`` could read what
the previous kernel has not written yet, and one launched without it would wait as before; so the
pairing is checked over the plugin's source, for every kernel and launch there is and every one added."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from deepinfer_cuda_sm100 import dispatch, settings

KERNELS = Path(dispatch.__file__).parent / "kernels"


def _sources():
    for path in sorted(KERNELS.glob("*.py")):
        yield path.name, ast.parse(path.read_text())


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) == "triton.jit" for d in fn.decorator_list)


def test_kernels_and_launches_found():
    kernels = [f for _, tree in _sources() for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
               and _is_jit(f) and f.name.endswith("_kernel")]  # fmt: skip
    assert len(kernels) >= 20


@pytest.mark.parametrize("name,tree", list(_sources()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_kernel_waits_first(name, tree):
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and _is_jit(fn) and fn.name.endswith("_kernel")):
            continue
        args = fn.args.args
        assert args[-1].arg == "PDL" and ast.unparse(fn.args.defaults[-1]) == "False", fn.name
        body = (
            fn.body[1:]
            if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
            else fn.body
        )
        assert ast.unparse(body[0]) == "pdl_enter(PDL)", f"{name}: {fn.name} must open with pdl_enter(PDL)"


@pytest.mark.parametrize("name,tree", list(_sources()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_launch_passes_pdl_args(name, tree):
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Subscript):
            kernel = ast.unparse(call.func.value)
            if kernel.endswith("_kernel"):
                spread = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
                assert any(s.startswith("dispatch.pdl_args(") for s in spread), (
                    f"{name}: launch of {kernel} without **dispatch.pdl_args(tokens)"
                )


def test_pdl_args_off_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.pdl_args(1) == {}


def test_pdl_args_on_hopper_for_few_tokens_unless_disabled(monkeypatch):
    from deepinfer_cuda_sm100.kernels import _common

    monkeypatch.setattr(dispatch, "arch", lambda: "sm90")
    assert dispatch.has_griddepcontrol() == (_common.gdc_wait is not None)  # the kernels' own probe
    if _common.gdc_wait is None:
        assert dispatch.pdl_args(1) == {}
        return
    assert (
        dispatch.pdl_args(1)
        == dispatch.pdl_args(dispatch.PDL_MAX_TOKENS)
        == {"PDL": True, "launch_pdl": True}
    )
    assert dispatch.pdl_args(dispatch.PDL_MAX_TOKENS + 1) == {}
    settings.use(settings.CudaSM100Settings(pdl=False))
    assert dispatch.pdl_args(1) == {}
