"""Verification of one sequence's drafts against the target's processed logits.

Rows ``x [k+1, V]`` are the target's logits after every logits processor, row ``j`` conditioned on the
drafts ``0..j-1`` (penalties and ``min_tokens`` count earlier drafts as outputs; the grammar mask follows
the drafts). The rule is speculative sampling: accept draft ``x`` with probability ``min(1, p(x)/q(x))``,
at the first rejection draw from ``normalize(max(0, p - q))``, after the last accepted draft draw the
bonus token from the next row's ``p``.

- greedy: ``p`` is one-hot at the argmax, so whatever ``q`` is: accept drafts while they equal the row's
  argmax; the first mismatch (or the row after the last draft) contributes the argmax itself;
- sampling with deterministic drafts (one-hot ``q``): accept ``x`` with probability ``p(x)``, on rejection
  draw from ``p`` with ``x`` removed; :func:`verify_sampled` realises it so that the draws are exactly
  those of plain sampling;
- sampling with drafts drawn from a proposer's ``q`` (:class:`~deepinfer_core.spec_decode.Draft`):
  :func:`verify_with_probs`, on ``SamplingOps.rejection_sample``.
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


def _device_ints(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def verify_sampled(
    ops: SamplingOps,
    probs: torch.Tensor,
    offsets: list[int],
    drafts: list[list[int]],
    seeds: list[int],
    positions: list[int],
) -> list[list[int]]:
    """Rejection sampling for one-hot drafts, realised by coupling: row ``j``'s token is drawn from
    ``p_j`` (``probs`` rows, laid out as in :func:`verify_greedy`) keyed at ``(seeds[b], positions[b] + j)``
    exactly as a non-speculative step would draw the token at that position; draft ``j`` is accepted iff the
    draw equals it (probability ``p_j(d) = min(1, p/q)`` for one-hot ``q``), and on rejection the draw itself
    is the token (``p_j`` conditioned on ``!= d``, i.e. ``normalize(max(0, p - q))``). After the last accepted
    draft the next row's draw is the bonus token. So a seeded request emits the same tokens with or without
    speculation, whatever the batching. Every row of every sequence is drawn in one ``ops.sample_keyed`` call
    (one read back): the draws past a sequence's first rejection are discarded, which changes nothing, as
    keyed draws leave no state behind. ``positions[b]``: the position of the token draft 0 proposes."""
    rows, keyed = [], []
    for b, d in enumerate(drafts):
        for j in range(len(d) + 1):
            rows.append(offsets[b] + j)
            keyed.append((seeds[b], positions[b] + j))
    s, at = torch.tensor(keyed, dtype=torch.int64, device=probs.device).reshape(-1, 2).T
    drawn = ops.sample_keyed(probs[rows], s, at).tolist()
    out: list[list[int]] = []
    first = 0
    for d in drafts:
        toks = []
        for j in range(len(d) + 1):
            toks.append(drawn[first + j])
            if j == len(d) or toks[-1] != d[j]:
                break
        out.append(toks)
        first += len(d) + 1
    return out


def verify_with_probs(
    ops: SamplingOps,
    probs: torch.Tensor,
    offsets: list[int],
    drafts: list[list[int]],
    draft_probs: list[torch.Tensor],
    seeds: list[int],
    positions: list[int],
) -> list[list[int]]:
    """Rejection sampling for drafts drawn from ``q``: sequence ``b``'s draft ``j`` was sampled from
    ``draft_probs[b][j]`` (``[len(drafts[b]), V]``), its target rows are ``probs`` rows ``offsets[b] ..
    offsets[b] + len(drafts[b])`` (laid out as in :func:`verify_greedy`). Sequences with the same number
    of drafts go to ``ops.rejection_sample_keyed`` together; each row's randomness is keyed by its seed and
    positions (``positions[b]``: that of the token draft 0 proposes), so its tokens do not depend on the
    batch. Returns each sequence's emitted tokens (accepted drafts, then one)."""
    out: list[list[int]] = [[] for _ in drafts]
    by_len: dict[int, list[int]] = {}
    for b, d in enumerate(drafts):
        by_len.setdefault(len(d), []).append(b)
    dev = probs.device
    for k, members in by_len.items():
        ids = torch.tensor([drafts[b] for b in members], dtype=torch.int64, device=dev).reshape(-1, k)
        q = torch.stack([draft_probs[b].to(dev, torch.float32) for b in members])
        p = torch.stack([probs[offsets[b] : offsets[b] + k + 1] for b in members])
        s = _device_ints([seeds[b] for b in members], dev)
        at = _device_ints([positions[b] for b in members], dev)
        tokens, accepted = ops.rejection_sample_keyed(ids, q, p, s, at)
        for b, row, n in zip(members, tokens.tolist(), accepted.tolist()):
            out[b] = row[: n + 1]
    return out
