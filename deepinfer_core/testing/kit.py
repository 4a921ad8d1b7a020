"""The conformance machinery: collect cases, build a platform's backends, compare against reference."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.fusions import COMPOSED, Fusion, resolve_fusions
from deepinfer_core.testing.opcase import OpCase


def all_cases() -> list[OpCase]:
    """Every case of every concern whose case module exists."""
    cases: list[OpCase] = []
    for concern in CONCERNS:
        try:
            mod = importlib.import_module(f"deepinfer_core.testing.cases_{concern}")
        except ModuleNotFoundError as e:
            if e.name != f"deepinfer_core.testing.cases_{concern}":
                raise
            continue
        cases.extend(mod.CASES)
    from deepinfer_core.testing import cases_fusions

    return cases + cases_fusions.CASES


def backends_for(name: str, extra_plugins: list[object] = ()) -> Backends:
    """Resolve the backends of platform ``name`` exactly as an engine would."""
    from deepinfer_core.config import load_config
    from deepinfer_core.runtime import build_runtime

    return build_runtime(load_config(backend=name), extra_plugins=list(extra_plugins)).backends


def to_device(obj: Any, device: torch.device) -> Any:
    """Move tensors (also inside lists, tuples, dicts and dataclasses) to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj,
            **{f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init},
        )
    return obj


def _compare(actual: Any, expected: Any, case: OpCase) -> None:
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), (
            f"{case.id}: result structure differs"
        )
        for a, e in zip(actual, expected):
            _compare(a, e, case)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{case.id}: expected a tensor, got {type(actual).__name__}"
        assert actual.shape == expected.shape, (
            f"{case.id}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        )
        assert actual.dtype == expected.dtype, f"{case.id}: dtype {actual.dtype} != {expected.dtype}"
        torch.testing.assert_close(
            actual, expected, atol=case.atol, rtol=case.rtol, equal_nan=True, msg=lambda m: f"{case.id}: {m}"
        )
        return
    assert actual == expected, f"{case.id}: {actual!r} != {expected!r}"


def _op(target: Any, case: OpCase, composed: bool = False) -> Callable[..., Any]:
    """The callable ``case`` runs: a concern's method of ``target`` (backends), or for a fusion the backends'
    resolved step; with ``composed``, ``target`` is one ops object and a fusion is its plain ops' composition."""
    if not case.fusion:
        return getattr(target if composed else getattr(target, case.concern), case.op)
    if composed:
        return functools.partial(COMPOSED[Fusion(case.op)], target)
    return getattr(resolve_fusions(target.dense, target.attention), case.op)


def check_case(backends: Backends, case: OpCase, reference: Backends | None = None, seed: int = 1234) -> None:
    """Run ``case`` on ``backends`` and on the reference ops with the same random inputs; raise
    ``AssertionError`` naming the case when they disagree beyond the case's tolerance."""
    from deepinfer_core.ops.reference import reference_op

    ref_obj = getattr(reference, case.concern) if reference is not None else reference_op(case.concern)
    args, kwargs = case.make_inputs(torch.Generator().manual_seed(seed))
    expected = _op(ref_obj, case, composed=True)(*args, **kwargs)
    device = backends.memory.device
    actual = _op(backends, case)(*to_device(args, device), **to_device(kwargs, device))
    actual = to_device(actual, torch.device("cpu"))
    if case.compare is not None:
        case.compare(actual, expected, (args, kwargs))
    else:
        _compare(actual, expected, case)
