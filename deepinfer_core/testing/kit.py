"""The conformance machinery: collect cases, build a platform's backends, compare against reference."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

import torch

from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.fusions import Fusion, composition, resolve_fusions
from deepinfer_core.testing import world
from deepinfer_core.testing.opcase import OpCase


def case_modules() -> list[str]:
    """``cases_<concern>`` for each concern, then every other ``cases_*`` module of this package."""
    import deepinfer_core.testing as package

    first = [f"cases_{c}" for c in CONCERNS]
    found = {m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("cases_")}
    return [m for m in first if m in found] + sorted(found - set(first))


def all_cases() -> list[OpCase]:
    """Every case of every ``cases_*`` module."""
    cases: list[OpCase] = []
    for name in case_modules():
        cases.extend(importlib.import_module(f"deepinfer_core.testing.{name}").CASES)
    return cases


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


def reference_backends() -> Backends:
    """The reference ops of every concern, built directly (no plugin manager)."""
    from deepinfer_core.ops.reference import reference_op

    return Backends("reference", **{c: reference_op(c) for c in CONCERNS})


def run_case(backends: Any, case: OpCase, args: tuple, kwargs: dict, composed: bool = False) -> Any:
    """Call the case's op on ``backends`` (inputs already on its device); with ``case.writes``, the
    result is ``(return value, *the written arguments)``. A fusion case runs the step the backends resolve
    (their fused op where declared, else the core's composition), or with ``composed`` the composition of
    their plain ops (what the reference side runs)."""
    if case.run is not None:
        result = case.run(backends, args, kwargs)
    elif case.fusion and composed:
        owners = {"dense": backends.dense, "attention": backends.attention}
        result = composition(Fusion(case.op), owners)(*args, **kwargs)
    elif case.fusion:
        result = getattr(resolve_fusions(backends.dense, backends.attention), case.op)(*args, **kwargs)
    else:
        result = getattr(getattr(backends, case.concern), case.op)(*args, **kwargs)
    if not case.writes:
        return result
    return (result, *(kwargs[w] if isinstance(w, str) else args[w] for w in case.writes))


def check_case(backends: Backends, case: OpCase, reference: Backends | None = None, seed: int = 1234) -> None:
    """Run ``case`` on ``backends`` and on the reference ops with the same random inputs; raise
    ``AssertionError`` naming the case when they disagree beyond the case's tolerance.

    Each side gets its own copy of the inputs (ops may write into them). A case of ``world > 1`` runs in
    that many processes (:mod:`deepinfer_core.testing.world`)."""
    if case.world > 1:
        failure = world.world_failure(backends, case, reference, seed, WORLD_FNS)
        if failure is not None:
            raise AssertionError(failure)
        return
    ref = reference if reference is not None else reference_backends()
    compare_outcomes(case, *outcomes(backends, case, ref, seed))


def outcomes(backends: Any, case: OpCase, reference: Any, seed: int) -> tuple[Any, Any, Any]:
    """``(actual, expected, inputs)``: the case run on ``backends`` (result moved to the CPU) and on
    ``reference``, each on its own copy of the inputs made from ``seed``; ``inputs`` is the reference's
    ``(args, kwargs)`` after its run. In this process (one rank's part of a multi-process case)."""
    args, kwargs = case.make_inputs(torch.Generator().manual_seed(seed))
    expected = run_case(reference, case, args, kwargs, composed=True)
    device = backends.memory.device
    mine, my_kwargs = case.make_inputs(torch.Generator().manual_seed(seed))
    actual = run_case(backends, case, to_device(mine, device), to_device(my_kwargs, device))
    return to_device(actual, torch.device("cpu")), expected, (args, kwargs)


def compare_outcomes(case: OpCase, actual: Any, expected: Any, inputs: Any) -> None:
    """Raise ``AssertionError`` naming ``case`` when ``actual`` does not conform."""
    if case.compare is not None:
        case.compare(actual, expected, inputs)
    else:
        _compare(actual, expected, case)


#: what the ranks of a multi-process case run (:mod:`deepinfer_core.testing.world` takes it from here)
WORLD_FNS = world.WorldFns(all_cases, reference_backends, outcomes, compare_outcomes)


def run_world(
    backends: Any, cases: list[OpCase], reference: Any, seed: int, size: int
) -> dict[OpCase, str | None]:
    """Run ``cases`` in a new group of ``size`` processes; ``{case: failure or None}``."""
    return world.run_world(backends, cases, reference, seed, size, WORLD_FNS)
