"""Top-k margins inside the reference: how close each discrete choice came to going the other way.

Three choices can flip under float noise: the MoE router's expert top-k (site ``router``, on ``scores +
bias``), the indexer's top-k of compressed positions (``indexer``) and the candidate source's top blocks
(``candidate``). For a top-``k`` over ``n > k`` values, the margin is ``v[k-1] - v[k]`` of the values sorted in
descending order (the last kept against the first dropped); ``inf`` where nothing competes (``k >= n``, or the
first dropped value is ``-inf``). Within the :class:`MarginRecorder` block, every top-k that runs while the
reference is inside ``Gate.forward``, ``Indexer.forward`` or ``select_candidate_blocks`` is recorded, and each
site keeps the minimum over layers per token.
"""

from __future__ import annotations

import torch

SITES = ("router", "indexer", "candidate")


def topk_margin(values: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """``values``' top-``k`` margin along ``dim`` (that dimension removed)."""
    n = values.size(dim)
    if k >= n:
        return torch.full(values.select(dim, 0).shape, torch.inf)
    v = torch.ops.aten.topk.default(values.float(), k + 1, dim, True, True)[0]
    m = v.select(dim, k - 1) - v.select(dim, k)
    return torch.where(torch.isnan(m) | (v.select(dim, k) == -torch.inf), torch.inf, m)


class MarginRecorder:
    """Context manager: per site, the minimum margin over every call, flattened to one value per token."""

    def __init__(self, ref, n_tokens: int):
        self.ref, self.n_tokens = ref, n_tokens
        self.margins = {s: torch.full((n_tokens,), torch.inf) for s in SITES}
        self._stack: list[str] = []
        self._undo: list = []

    def _record(self, margin: torch.Tensor) -> None:
        site = self._stack[-1]
        flat = margin.reshape(-1)[: self.n_tokens]
        self.margins[site] = torch.minimum(self.margins[site], flat)

    def _topk(self, original):
        def topk(t, k, dim=-1, largest=True, sorted=True):
            if self._stack:
                self._record(topk_margin(t, k, dim))
            return original(t, k, dim, largest, sorted)

        return topk

    def _enter_site(self, owner, name: str, site: str) -> None:
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self._stack.append(site)
            try:
                return original(*args, **kwargs)
            finally:
                self._stack.pop()

        setattr(owner, name, wrapped)
        self._undo.append((owner, name, original))

    def __enter__(self):
        m = self.ref.model
        self._enter_site(m.Gate, "forward", "router")
        self._enter_site(m.Indexer, "forward", "indexer")
        self._enter_site(m, "select_candidate_blocks", "candidate")
        original = torch.Tensor.topk
        torch.Tensor.topk = self._topk(original)
        self._undo.append((torch.Tensor, "topk", original))
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def stacked(self) -> torch.Tensor:
        """``[n_tokens, 3]`` float32: router, indexer and candidate margins (``inf``: no such choice)."""
        return torch.stack([self.margins[s] for s in SITES], dim=-1)
