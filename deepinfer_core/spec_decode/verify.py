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

from deepinfer_core.ops.sampling import SamplingOps


def verify_greedy(
    ops: SamplingOps, x: torch.Tensor, offsets: list[int], drafts: list[list[int]]
) -> list[list[int]]:
    """Sequence ``b`` owns rows ``offsets[b] .. offsets[b] + len(drafts[b])`` of ``x``; returns its emitted
    tokens: the accepted drafts, then the argmax of the row after them."""
    target = ops.argmax(x).tolist()
    out = []
    for off, d in zip(offsets, drafts):
        a = 0
        while a < len(d) and d[a] == target[off + a]:
            a += 1
        out.append(target[off : off + a + 1])
    return out


def verify_sampled(
    ops: SamplingOps,
    probs: torch.Tensor,
    offsets: list[int],
    drafts: list[list[int]],
    generators: list[torch.Generator],
) -> list[list[int]]:
    """Rejection sampling for one-hot drafts, realised by coupling: row ``j``'s token is drawn from
    ``p_j`` (``probs`` rows, laid out as in :func:`verify_greedy`) with the sequence's generator exactly
    as a non-speculative step would draw it; draft ``j`` is accepted iff the draw equals it (probability
    ``p_j(d) = min(1, p/q)`` for one-hot ``q``), and on rejection the draw itself is the token (``p_j``
    conditioned on ``!= d``, i.e. ``normalize(max(0, p - q))``). After the last accepted draft the next
    row's draw is the bonus token. One draw per emitted token, so a seeded request emits the same tokens
    with or without speculation, whatever the batching. Depth ``j`` of every sequence still accepting is
    drawn in one ``ops.sample`` call."""
    out: list[list[int]] = [[] for _ in drafts]
    active, j = list(range(len(drafts))), 0
    while active:
        rows = [offsets[b] + j for b in active]
        drawn = ops.sample(probs[rows], [generators[b] for b in active]).tolist()
        still = []
        for b, t in zip(active, drawn):
            out[b].append(t)
            if j < len(drafts[b]) and t == drafts[b][j]:
                still.append(b)
        active, j = still, j + 1
    return out
