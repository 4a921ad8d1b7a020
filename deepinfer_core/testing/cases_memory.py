"""Conformance cases for the memory ops. These check properties of the platform's own memory rather than
numbers against the reference (whose host memory answers differently): pools are zero-filled tensors of
the asked shape and dtype on the platform's device; a host buffer holds what is copied through it to the
device and back (``synchronize`` waited for the copy); the KV budget is a sane byte count; and a platform
that captures graphs returns a replay that redoes the captured writes with the buffers' new values.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_core.testing.cases_dense import randn
from deepinfer_core.testing.opcase import OpCase


def _alloc_inputs(g: torch.Generator) -> tuple[tuple, dict]:
    dims = tuple(int(x) for x in torch.randint(1, 9, (3,), generator=g))
    return ((dims, torch.float32), {})


def _same_empty_pool(actual: torch.Tensor, expected: torch.Tensor, inputs) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, "allocate: wrong shape or dtype"
    assert torch.count_nonzero(actual) == 0, "allocate: a new pool must be zero-filled"


def _on(device: torch.device, tensor: torch.Tensor) -> bool:
    return tensor.device.type == device.type and device.index in (None, tensor.device.index)


def _pool_of(dtype: torch.dtype):
    def make(g: torch.Generator) -> tuple[tuple, dict]:
        return ((int(torch.randint(2, 9, (1,), generator=g)), 16, 24), dtype), {}

    return make


def _allocated(backends: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """The pool, and whether it is on the platform's device."""
    pool = backends.memory.allocate(*args)
    return pool, _on(backends.memory.device, pool)


def _host_buffer(g: torch.Generator) -> tuple[tuple, dict]:
    return ((3, 40), torch.bfloat16, randn(g, 3, 40).to(torch.bfloat16)), {}


def _through_host_buffer(backends: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The buffer's shape, dtype, whether it is on the host (and pinned where the device is not), and the
    values copied through it to the device and back."""
    shape, dtype, values = args
    memory = backends.memory
    buf = memory.pinned_host_buffer(shape, dtype)
    out = {"shape": tuple(buf.shape), "dtype": buf.dtype, "device": buf.device.type, "back": None}
    out["pinned"] = memory.device.type == "cpu" or buf.is_pinned()
    if out["shape"] == tuple(shape) and buf.dtype == dtype:
        buf.copy_(values)
        on_device = buf.to(memory.device, non_blocking=True)
        memory.synchronize()
        out["back"] = on_device.cpu()
    return out


def _usable_host_buffer(actual: dict[str, Any], expected: Any, inputs: Any) -> None:
    shape, dtype, values = inputs[0]
    got = f"pinned_host_buffer({shape}, {dtype}) gave {actual['shape']} {actual['dtype']}"
    assert actual["shape"] == tuple(shape) and actual["dtype"] == dtype, got
    assert actual["device"] == "cpu", f"pinned_host_buffer: the buffer is on {actual['device']}, not the host"
    assert actual["pinned"], "pinned_host_buffer: the buffer is not pinned (asynchronous copies need it)"
    torch.testing.assert_close(actual["back"], values, atol=0.0, rtol=0.0)


def _budget_inputs(g: torch.Generator) -> tuple[tuple, dict]:
    return (1 << 50,), {}  # a model larger than any device


def _budgets(backends: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    memory, (huge,) = backends.memory, args
    return {
        "quarter": memory.available_kv_bytes(0.25, 0),
        "all": memory.available_kv_bytes(1.0, 0),
        "half_huge_model": memory.available_kv_bytes(0.5, huge),
    }


def _sane_budgets(actual: dict[str, Any], expected: Any, inputs: Any) -> None:
    """Whole non-negative byte counts; more memory allowed never means less KV, nor does a larger model
    mean more. (The utilisations are far apart: free memory moving between the calls cannot flip them.)"""
    for name, n in actual.items():
        assert isinstance(n, int) and n >= 0, f"available_kv_bytes ({name}) = {n!r}: not a byte count"
    assert actual["quarter"] <= actual["all"], (
        f"available_kv_bytes: 25% of memory gives more than 100%: {actual}"
    )
    assert actual["half_huge_model"] <= actual["all"], (
        f"available_kv_bytes: a larger model gives more: {actual}"
    )


def _graph_inputs(g: torch.Generator) -> tuple[tuple, dict]:
    return (randn(g, 4, 32), randn(g, 4, 32)), {}


def _replayed(backends: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """Capture ``out = inp * 2 + 1`` over static buffers, put new values in ``inp``, replay: ``out``."""
    first, second = args
    memory = backends.memory
    inp, out = first.clone(), torch.zeros_like(first)

    def step() -> None:
        out.copy_(inp)
        out.mul_(2.0).add_(1.0)

    replay = memory.capture_graph(step)
    if replay is None:
        return None
    inp.copy_(second)
    out.zero_()
    replay()
    memory.synchronize()
    return out.clone()


def _replays_the_writes(actual: torch.Tensor | None, expected: Any, inputs: Any) -> None:
    assert actual is not None, "capture_graph returned None, but the platform declares supports_graphs"
    torch.testing.assert_close(actual, inputs[0][1] * 2.0 + 1.0, atol=0.0, rtol=0.0)


def _recaptured(backends: Any, args: tuple, kwargs: dict) -> dict | None:
    """Capture a step whose result is a new tensor (memory the graph owns), keep that result, drop the first
    graph, then capture and replay a second step: what an engine built after another one on the same
    platform does (its graphs gone, a tensor they made still held). Both results after a replay."""
    first, second = args
    memory = backends.memory
    inp = first.clone()
    made: list[torch.Tensor] = []
    replay = memory.capture_graph(lambda: made.append(inp * 2.0))
    if replay is None:
        return None
    replay()
    held = made[-1]  # the captured step's own result: it outlives the graph
    replay = None
    made.clear()
    out = torch.zeros_like(inp)

    def step() -> None:
        out.copy_(inp)
        out.mul_(3.0)

    again = memory.capture_graph(step)
    if again is None:
        return None
    inp.copy_(second)
    out.zero_()
    again()
    memory.synchronize()
    return {"held": held.clone(), "second": out.clone()}


def _both_graphs_work(actual: dict | None, expected: Any, inputs: Any) -> None:
    assert actual is not None, "capture_graph returned None, but the platform declares supports_graphs"
    first, second = inputs[0]
    torch.testing.assert_close(actual["held"], first * 2.0, atol=0.0, rtol=0.0)
    torch.testing.assert_close(actual["second"], second * 3.0, atol=0.0, rtol=0.0)


def _needs_graphs(backends: Any) -> str | None:
    if getattr(backends.memory, "supports_graphs", False):
        return None
    return "the platform does not capture graphs (MemoryOps.supports_graphs is False)"


def _scaled_table(g: torch.Generator) -> tuple[tuple, dict]:
    """An Engram-format table of 30 rows x 64 (e4m3 code bytes, NaN codes left out; a ue8m0 byte per 32, one of
    them 0, i.e. ``2**-127``) and 9 row ids, repeats among them, into bf16."""
    codes = torch.randint(0, 256, (30, 64), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x38
    scales = torch.randint(110, 140, (30, 2), generator=g, dtype=torch.uint8)
    scales[3, 1] = 0
    ids = torch.tensor([3, 0, 29, 3, 17, 8, 8, 21, 3])
    return (codes, scales, ids, (torch.float8_e4m3fn, torch.float8_e8m0fnu, 32), torch.bfloat16), {}


def _dequant_rows(backends: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """The table made readable by the device, the rows read and dequantised there, brought back."""
    codes, scales, ids, formats, dtype = args
    memory = backends.memory
    c, s = memory.readable_host_copy(codes), memory.readable_host_copy(scales)
    return memory.host_rows_dequant(c, s, ids.to(memory.device), formats, dtype).cpu()


def _exact(op: str, name: str, make, run) -> OpCase:
    return OpCase("memory", op, name, make, atol=0.0, rtol=0.0, run=run)


CASES = [
    OpCase("memory", "allocate", "zeroed_pool", _alloc_inputs, compare=_same_empty_pool),
    _exact("allocate", "bf16_pool_on_device", _pool_of(torch.bfloat16), _allocated),
    _exact("allocate", "uint8_rows_on_device", _pool_of(torch.uint8), _allocated),
    OpCase(
        "memory",
        "pinned_host_buffer",
        "round_trip_through_device",
        _host_buffer,
        run=_through_host_buffer,
        compare=_usable_host_buffer,
    ),
    OpCase(
        "memory", "available_kv_bytes", "sane_budgets", _budget_inputs, run=_budgets, compare=_sane_budgets
    ),
    _exact("host_rows_dequant", "engram_e4m3_ue8m0", _scaled_table, _dequant_rows),
    OpCase(
        "memory",
        "capture_graph",
        "replay_redoes_writes",
        _graph_inputs,
        run=_replayed,
        compare=_replays_the_writes,
        requires=_needs_graphs,
    ),
    OpCase(
        "memory",
        "capture_graph",
        "after_a_released_graph",
        _graph_inputs,
        run=_recaptured,
        compare=_both_graphs_work,
        requires=_needs_graphs,
    ),
]
