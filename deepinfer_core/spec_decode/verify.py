"""Verification of one sequence's drafts against the target's processed logits.

Rows ``x [k+1, V]`` are the target's logits after every logits processor, row ``j`` conditioned on the
drafts ``0..j-1`` (penalties and ``min_tokens`` count earlier drafts as outputs; the grammar mask follows
the drafts). Drafts are one-hot (``q = 1`` on the draft), so:

- greedy: accept drafts while they equal the row's argmax; the first mismatch (or the row after the last
  draft) contributes the argmax itself;
- sampling: ``backends.sampling.rejection_sample`` with ``draft_probs=None`` (accept ``x`` with
  probability ``p(x)``, on rejection draw from ``p`` with ``x`` removed, bonus from the last row), using
  the sequence's own generator.
"""

from __future__ import annotations

import torch

from deepinfer_core.ops.sampling import SamplingOps, SamplingTensors


def verify_greedy(ops: SamplingOps, x: torch.Tensor, drafts: list[int]) -> tuple[list[int], int]:
    """-> (emitted tokens, number of accepted drafts); ``len(emitted) == accepted + 1``."""
    target = ops.argmax(x).tolist()
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    return target[: a + 1], a


def verify_sampled(
    ops: SamplingOps, x: torch.Tensor, drafts: list[int], params: object, generator: torch.Generator
) -> tuple[list[int], int]:
    rows, dev = x.shape[0], x.device
    st = SamplingTensors(
        temperature=torch.full((rows,), float(params.temperature), dtype=torch.float32, device=dev),
        top_k=torch.full((rows,), int(params.top_k), dtype=torch.int64, device=dev),
        top_p=torch.full((rows,), float(params.top_p), dtype=torch.float32, device=dev),
        min_p=torch.full((rows,), float(params.min_p), dtype=torch.float32, device=dev),
    )
    p = ops.probs(x, st)
    ids = torch.tensor([drafts], dtype=torch.int64, device=dev)
    tokens, accepted = ops.rejection_sample(ids, None, p[None], [generator])
    a = int(accepted[0])
    return tokens[0, : a + 1].tolist(), a
