"""The keyed draw (``deepinfer_core.ops.draws.draw``) against the generator a row it replaced, on the CPU, one thread.

    python benchmarks/draw_cpu.py

Per shape: milliseconds a call (mean of 20 after one warm-up) for ``draws.draw`` over ``[B, V]`` probabilities, and
for the old way, a ``torch.Generator`` a row (``exponential_`` then ``argmax(p / E)``), as plugin API 2.7 drew.
"""

from __future__ import annotations

import functools
import time

import torch

from deepinfer_core.ops import draws


def _ms(fn, n: int = 20) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def _per_row(p: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
    return torch.stack(
        [torch.argmax(p[b] / torch.empty_like(p[b]).exponential_(generator=g)) for b, g in enumerate(gens)]
    )


def main() -> None:
    torch.set_num_threads(1)
    print("rows  vocab   keyed ms   a generator a row ms")
    for B, V in [(1, 8192), (16, 8192), (64, 8192), (1, 129280)]:
        p = torch.rand(B, V, generator=torch.Generator().manual_seed(0)).softmax(-1)
        seeds, at = torch.arange(B), torch.arange(B)
        gens = [torch.Generator().manual_seed(b) for b in range(B)]
        keyed = _ms(functools.partial(draws.draw, p, seeds, at))
        print(f"{B:4d} {V:6d} {keyed:10.3f} {_ms(functools.partial(_per_row, p, gens)):22.3f}")


if __name__ == "__main__":
    main()
