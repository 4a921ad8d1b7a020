"""What the model runner hands a model for one step: the flattened tokens of every scheduled request.

``T`` tokens from ``B`` requests, request ``b`` owning rows ``query_start_loc[b]:query_start_loc[b+1]``.
Request ``b`` already has ``context_lens[b] - query_lens[b]`` computed tokens in the KV pools; the
step computes (and writes state for) positions ``context_lens[b] - query_lens[b] ... context_lens[b] - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute position of each token in its request
    query_start_loc: torch.Tensor  # [B+1] int64
    context_lens: torch.Tensor  # [B] int64, computed tokens after this step
    block_tables: dict[str, torch.Tensor]  # group name -> [B, max_blocks] int64 physical block ids (-1: none)
    block_size: int
    #: rows of the flattened tokens whose logits are needed (last token of each request that
    #: samples, every prompt row for prompt_logprobs, every draft row for verification)
    logits_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    #: optional: run only these decoder layers (``None``: all); for V4.1-style partial replays
    layer_range: tuple[int, int] | None = None
    #: model-specific tables built on the host by ``CausalLM.plan`` (``None``: the model builds them)
    plan: Any = None
    #: static steps (graph replay): ``(batch bucket, context bucket)`` and how many rows are real
    graph_key: tuple[int, int] | None = None
    num_real_rows: int | None = None

    def to(self, device: torch.device) -> ForwardBatch:
        """A copy with every tensor (and the plan, if it has ``.to``) on ``device``."""
        return ForwardBatch(
            input_ids=self.input_ids.to(device),
            positions=self.positions.to(device),
            query_start_loc=self.query_start_loc.to(device),
            context_lens=self.context_lens.to(device),
            block_tables={g: t.to(device) for g, t in self.block_tables.items()},
            block_size=self.block_size,
            logits_indices=self.logits_indices.to(device),
            layer_range=self.layer_range,
            plan=self.plan.to(device) if self.plan is not None else None,
            graph_key=self.graph_key,
            num_real_rows=self.num_real_rows,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_requests(self) -> int:
        return int(self.context_lens.shape[0])

    def request_index(self) -> torch.Tensor:
        """``[T]`` index of the request each token row belongs to."""
        counts = self.query_start_loc[1:] - self.query_start_loc[:-1]
        return torch.repeat_interleave(torch.arange(self.num_requests, device=counts.device), counts)
