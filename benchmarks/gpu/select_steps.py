"""How many counts the select kernel's bisection takes (``kernels/indexer.py``, ``_topk_select_kernel``): the same
integer bisection, stopping at the first midpoint with exactly ``k`` keys at or above it, replayed on the CPU over
random score rows; each result checked against ``torch.topk``'s k-th largest key.

    python benchmarks/gpu/select_steps.py
"""

from __future__ import annotations

import torch


def keys(s: torch.Tensor) -> torch.Tensor:
    bits = s.float().view(torch.int32).long()
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def counts(key: torch.Tensor, k: int) -> int:
    lo, hi, n = int(key.min()), int(key.max()), 0
    going = key.numel() > k
    while lo < hi and going:
        mid = lo + (hi - lo + 1) // 2
        count = int((key >= mid).sum())
        n += 1
        going = count != k
        lo, hi = (mid, hi) if count >= k else (lo, mid - 1)
    kth = int(key[key >= lo].min())
    assert kth == int(key.topk(k).values[-1]), "not the k-th largest key"
    return n


def main() -> None:
    g = torch.Generator().manual_seed(0)
    for c, k in [(1024, 512), (2048, 512), (4096, 512), (8192, 1024)]:
        n = []
        for trial in range(200):
            s = (
                torch.randn(c, generator=g) * (0.1 + 10 * torch.rand(1, generator=g))
                + 10 * torch.rand(1, generator=g)
                - 5
            )
            n.append(counts(keys(s.abs() if trial % 2 else s), k))
        t = torch.tensor(n, dtype=torch.float64)
        print(f"C={c} k={k}: counts mean {t.mean():.1f}, min {int(t.min())}, max {int(t.max())} (33 before)")


if __name__ == "__main__":
    main()
