"""A tiny paged-KV harness for model tests: pools for a model's cache specs, block tables, ForwardBatches.

Not the engine's KV manager: it never frees or shares blocks, and hands out block ids in a shuffled
order so a model that confuses logical and physical blocks fails loudly. Usage::

    h = PagedKVHarness(model.cache_specs(), block_size=16, num_blocks=64)
    a = h.add_sequence()
    batch = h.step({a: prompt_ids[:40]})          # a prefill chunk
    hidden = model.forward(batch, h.pools)
    batch = h.step({a: prompt_ids[40:]})           # the rest, and so on
    h.truncate(a, 30)                              # roll back to 30 computed tokens
"""

from __future__ import annotations

import torch

from deepinfer_core.kv.spec import CacheSpec, required_block_multiple
from deepinfer_core.models.batch import ForwardBatch


class PagedKVHarness:
    def __init__(
        self, specs: list[CacheSpec], block_size: int | None = None, num_blocks: int = 256, seed: int = 0
    ):
        self.specs = specs
        self.block_size = block_size or required_block_multiple(specs)
        self.pools = {
            s.name: torch.zeros(
                (num_blocks, s.entries_per_block(self.block_size), *s.entry_shape), dtype=s.dtype
            )
            for s in specs
        }
        self.groups = sorted({s.group for s in specs}) or ["window"]
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self._free = {g: list(order) for g in self.groups}
        self._tables: dict[int, dict[str, list[int]]] = {}
        self.lengths: dict[int, int] = {}

    def add_sequence(self) -> int:
        sid = len(self._tables)
        self._tables[sid] = {g: [] for g in self.groups}
        self.lengths[sid] = 0
        return sid

    def truncate(self, sid: int, num_tokens: int) -> None:
        """Roll sequence ``sid`` back to ``num_tokens`` computed tokens (state is rewritten before reuse)."""
        self.lengths[sid] = min(self.lengths[sid], num_tokens)

    def _ensure_blocks(self, sid: int, num_tokens: int) -> None:
        need = -(-num_tokens // self.block_size)
        for g, table in self._tables[sid].items():
            while len(table) < need:
                if not self._free[g]:
                    raise RuntimeError(f"kv harness: out of {g!r} blocks; raise num_blocks")
                table.append(self._free[g].pop())

    def step(
        self, chunks: dict[int, list[int]], logits: str = "last", positions_from: dict[int, int] | None = None
    ) -> ForwardBatch:
        """A ForwardBatch appending ``chunks[sid]`` to each sequence (in dict order) and advancing its length.

        ``logits``: ``"last"`` (last row of each sequence) or ``"all"``. ``positions_from`` overrides the start
        position of a sequence (e.g. an MTP pass over positions already computed by the main model).
        """
        ids, pos, starts, ctx, rows = [], [], [0], [], []
        for sid, toks in chunks.items():
            start = (positions_from or {}).get(sid, self.lengths[sid])
            end = start + len(toks)
            self._ensure_blocks(sid, end)
            ids += list(toks)
            pos += list(range(start, end))
            starts.append(starts[-1] + len(toks))
            ctx.append(end)
            rows += list(range(starts[-2], starts[-1])) if logits == "all" else [starts[-1] - 1]
            self.lengths[sid] = max(self.lengths[sid], end) if positions_from else end
        width = max((len(t[g]) for t in (self._tables[s] for s in chunks) for g in self.groups), default=0)
        tables = {
            g: torch.tensor(
                [self._tables[s][g] + [-1] * (width - len(self._tables[s][g])) for s in chunks],
                dtype=torch.int64,
            ).reshape(len(chunks), width)
            for g in self.groups
        }
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(pos, dtype=torch.int64),
            query_start_loc=torch.tensor(starts, dtype=torch.int64),
            context_lens=torch.tensor(ctx, dtype=torch.int64),
            block_tables=tables,
            block_size=self.block_size,
            logits_indices=torch.tensor(rows, dtype=torch.int64),
        )
