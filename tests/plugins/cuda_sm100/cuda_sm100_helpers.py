"""Shared helpers of the cuda_sm100 kernel tests (imported after conftest set ``TRITON_INTERPRET``)."""

from __future__ import annotations

import os

import pytest
import torch

try:
    import triton  # noqa: F401

    TRITON_ERROR = None
except Exception as exc:  # noqa: BLE001 - any import failure means "no triton here"
    TRITON_ERROR = f"triton is not importable: {type(exc).__name__}: {exc}"

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

needs_triton = pytest.mark.skipif(TRITON_ERROR is not None, reason=TRITON_ERROR or "")


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||a - e|| / ||e||`` in float64; NaN or a shape mismatch counts as infinitely wrong."""
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    if a.shape != e.shape or torch.isnan(a).any():
        return float("inf")
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


#: Error bounds by input dtype (METHOD: bf16 operands land between 1e-3 and 1e-2; float32 far below,
#: TF32 on a GPU near 3e-4).
BOUND = {torch.float32: 1e-4 if INTERPRETED else 1e-3, torch.bfloat16: 1e-2}


def rand(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Random normal values on the CPU (never zeros); move with ``.to(DEVICE)``."""
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def dev(*xs):
    """The arguments moved to the test device (``None`` passes through)."""
    out = tuple(x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in xs)
    return out[0] if len(out) == 1 else out


class Counting:
    """Stands in for a ``@triton.jit`` kernel: records each launch's grid (or ``tag``, to tell kernels apart in one
    list), then launches the real one."""

    def __init__(self, kernel, launches: list, tag: str | None = None):
        self.kernel, self.launches, self.tag = kernel, launches, tag

    def __getitem__(self, grid):
        self.launches.append(grid if self.tag is None else self.tag)
        return self.kernel[grid]


def slot_lists(gen: torch.Generator, T: int, K: int, S: int, pad_frac: float = 0.3) -> torch.Tensor:
    """``[T, K]`` slot ids below ``S``, about ``pad_frac`` of them ``-1`` (padding)."""
    s = torch.randint(0, S, (T, K), generator=gen)
    return torch.where(torch.rand(T, K, generator=gen) < pad_frac, -1, s)


def spread_rows(gen: torch.Generator, n: int, d: int) -> torch.Tensor:
    """Rows whose channels differ in size by up to 2**14, so every scale group gets its own scale."""
    return rand(gen, n, d) * 2.0 ** torch.randint(-7, 7, (1, d), generator=gen).float()
