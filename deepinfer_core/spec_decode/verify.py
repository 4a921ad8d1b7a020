"""Verification of one sequence's drafts against the target's processed logits.

Rows ``x [k+1, V]`` are the target's logits after every logits processor, row ``j`` conditioned on the
drafts ``0..j-1`` (penalties and ``min_tokens`` count earlier drafts as outputs; the grammar mask follows
the drafts). Drafts are one-hot (``q = 1`` on the draft), so:

- greedy: accept drafts while they equal the row's argmax; the first mismatch (or the row after the last
  draft) contributes the argmax itself;
- sampling: accept draft ``x`` with probability ``p(x)`` (``min(1, p/q)`` with one-hot ``q``), on
  rejection draw from ``p`` with ``x`` removed, bonus from the row after the last draft; see
  :func:`verify_sampled` for how the sequence's generator realises it.
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
    """Rejection sampling for one-hot drafts, realised by coupling: row ``j``'s token is drawn from
    ``p_j`` with the sequence's generator exactly as a non-speculative step would draw it; draft ``j`` is
    accepted iff the draw equals it (probability ``p_j(d) = min(1, p/q)`` for ``q`` one-hot), and on
    rejection the draw itself is the token (``p_j`` conditioned on ``!= d``: ``normalize(max(0, p - q))``).
    After the last accepted draft the next row's draw is the bonus token. One draw per emitted token,
    so a seeded request emits the same tokens with or without speculation, whatever the batching."""
    rows, dev = x.shape[0], x.device
    st = SamplingTensors(
        temperature=torch.full((rows,), float(params.temperature), dtype=torch.float32, device=dev),
        top_k=torch.full((rows,), int(params.top_k), dtype=torch.int64, device=dev),
        top_p=torch.full((rows,), float(params.top_p), dtype=torch.float32, device=dev),
        min_p=torch.full((rows,), float(params.min_p), dtype=torch.float32, device=dev),
    )
    p = ops.probs(x, st)
    out: list[int] = []
    for j in range(rows):
        t = int(ops.sample(p[j : j + 1], [generator])[0])
        out.append(t)
        if j == len(drafts) or t != drafts[j]:
            break
    return out, len(out) - 1
