"""A model with no weights: checks every block table it is given and returns cheap, position-driven logits.

Used where the engine's bookkeeping is under test (hypothesis tests, the overhead benchmark).
"""

from __future__ import annotations

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch


class StubLM(CausalLM):
    def __init__(self, specs: list[CacheSpec], vocab_size: int = 64, max_pos: int = 4096, check: bool = True):
        self.specs = specs
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_pos
        self.eos_token_ids = [1]
        self.check = check
        self.windows = {s.group: s.window for s in specs if s.group == "window"}

    @classmethod
    def from_checkpoint(cls, path, backends, dtype):  # pragma: no cover - built directly
        raise NotImplementedError

    def cache_specs(self) -> list[CacheSpec]:
        return self.specs

    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.check:
            self._check_tables(batch)
        return batch.positions.to(torch.float32)[:, None]

    def _check_tables(self, batch: ForwardBatch) -> None:
        """Every block the step reads or writes must be present: all compressed blocks up to the end, and
        window blocks from ``start - window``."""
        qsl, ctx, bs = batch.query_start_loc.tolist(), batch.context_lens.tolist(), batch.block_size
        for g, table in batch.block_tables.items():
            for b in range(batch.num_requests):
                start, end = ctx[b] - (qsl[b + 1] - qsl[b]), ctx[b]
                lo = max(0, start - self.windows[g]) // bs if g == "window" else 0
                row = table[b, lo : -(-end // bs)].tolist()
                assert len(row) == -(-end // bs) - lo and min(row) >= 0, (
                    f"{g} blocks missing for request {b}: {row}"
                )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        pos = hidden[:, 0].to(torch.int64)
        tok = torch.where(pos % 23 == 5, 1, (pos * 7 + 3) % (self.vocab_size - 2) + 2)
        return 10.0 * torch.nn.functional.one_hot(tok, self.vocab_size).to(torch.float32)
