"""The engine's :class:`~deepinfer_core.spec_decode.ProposerContext`: the runner's tap, KV reservation, the
pools, draft batches that run as captured graphs like decode steps, and the sampling transform and the keyed
draws a proposer samples its drafts with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from deepinfer_core.engine.model_runner import ModelRunner
from deepinfer_core.engine.sampler import sampling_tensors
from deepinfer_core.kv.kv_manager import KVCacheManager
from deepinfer_core.models.batch import ForwardBatch
from deepinfer_core.spec_decode import DraftFn, DraftSequence, ProposerContext


class EngineProposerContext(ProposerContext):
    def __init__(self, runner: ModelRunner, kv: KVCacheManager):
        self._runner, self._kv = runner, kv
        self.model = runner.model
        self.device = runner.device

    def last_hidden(self) -> torch.Tensor | None:
        return self._runner.last_hidden

    def reserve(self, seq: DraftSequence, num_tokens: int) -> bool:
        return self._kv.allocate(seq, num_tokens)  # type: ignore[arg-type] - engine sequences

    def pools(self) -> Mapping[str, torch.Tensor]:
        return self._runner.kv

    def draft_batch(
        self, seqs: Sequence[DraftSequence], starts: Sequence[int], ids: Sequence[Sequence[int]]
    ) -> ForwardBatch:
        runner = self._runner
        batch = runner.static_batch(seqs, starts, ids)
        if batch is None:
            batch = _dynamic_batch(runner, seqs, starts, ids)
        batch.plan = self.model.plan_draft(batch, batch.graph_key[1] if batch.graph_key else None)
        return batch.to(self.device)

    def run(
        self, key: Any, fn: DraftFn, batch: ForwardBatch, *inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            return self._runner.run_static(("draft", key), fn, batch, *inputs)

    def draft_probs(self, seqs: Sequence[DraftSequence], logits: torch.Tensor) -> torch.Tensor:
        ops = self._runner.backends.sampling
        return ops.probs(logits.float(), sampling_tensors(list(seqs), logits.device))

    def draw(self, seqs: Sequence[DraftSequence], probs: torch.Tensor) -> list[int]:
        """Keyed at each sequence's ``(draft_seed, num_draft_draws)``, which then advances by one."""
        keyed = []
        for s in seqs:  # engine sequences
            keyed.append((s.draft_seed, s.num_draft_draws))  # type: ignore[attr-defined]
            s.num_draft_draws += 1  # type: ignore[attr-defined]
        seeds, at = torch.tensor(keyed, dtype=torch.int64, device=probs.device).T
        return self._runner.backends.sampling.sample_keyed(probs, seeds, at).tolist()


def _dynamic_batch(
    runner: ModelRunner, seqs: Sequence[DraftSequence], starts: Sequence[int], ids: Sequence[Sequence[int]]
) -> ForwardBatch:
    flat = [t for toks in ids for t in toks]
    positions = [p for st, toks in zip(starts, ids) for p in range(st, st + len(toks))]
    qsl, ctx = [0], []
    for st, toks in zip(starts, ids):
        qsl.append(qsl[-1] + len(toks))
        ctx.append(st + len(toks))
    return ForwardBatch(
        input_ids=torch.tensor(flat, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl, dtype=torch.int64),
        context_lens=torch.tensor(ctx, dtype=torch.int64),
        block_tables={g: runner.block_table(seqs, g, len(seqs)) for g in runner.groups},
        block_size=runner.block_size,
        logits_indices=torch.arange(len(flat), dtype=torch.int64),
    )
