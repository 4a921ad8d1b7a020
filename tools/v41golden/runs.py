"""Prompt logprobs and greedy continuations from the reference: prefill in one forward, then one token a step.

For a prompt of ``L`` tokens and ``G`` greedy tokens, :func:`prompt_and_greedy` returns (``K`` = :data:`TOPK`):

- ``logprob`` ``[L-1]``: log-softmax of position ``t``'s logits at the prompt's token ``t+1``;
- ``topk_ids`` / ``topk_logprobs`` ``[L, K]``: each prompt position's ``K`` best tokens, best first;
- ``margins`` ``[L, 3]``: the router / indexer / candidate top-k margins (:mod:`v41golden.margins`), minimum over
  layers, per position;
- ``greedy_ids`` ``[G]``: the continuation (the first from the prefill's last position, then one decode step each);
- ``greedy_logprob`` ``[G]``, ``greedy_top2_gap`` ``[G]`` (best minus second-best logprob), ``greedy_topk_ids`` /
  ``greedy_topk_logprobs`` ``[G, K]`` and ``greedy_margins`` ``[G, 3]`` (the forward that produced each token).
"""

from __future__ import annotations

import torch

from .margins import MarginRecorder
from .patches import capture_logits

TOPK = 4


def forward_once(model, ref, ids: list[int], start_pos: int):
    """One reference forward: its sampled (greedy) next token, every position's logits ``[s, V]`` and the
    margins ``[s, 3]``."""
    with capture_logits(model) as cap, MarginRecorder(ref, len(ids)) as rec:
        next_id, _, _ = model(torch.tensor([ids]), start_pos)
    return int(next_id[0]), cap.last[0].float(), rec.stacked()


def _topk(logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = logprobs.topk(TOPK, dim=-1)
    return i.int(), v


def prompt_and_greedy(model, ref, ids: list[int], greedy_tokens: int) -> dict[str, torch.Tensor]:
    token, logits, margins = forward_once(model, ref, ids, 0)
    lp = logits.log_softmax(-1)
    out = {"logprob": lp[:-1].gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1), "margins": margins}
    out["topk_ids"], out["topk_logprobs"] = _topk(lp)
    steps = [(token, lp[-1], margins[-1])]
    for i in range(greedy_tokens - 1):
        token, logits, margins = forward_once(model, ref, [steps[-1][0]], len(ids) + i)
        steps.append((token, logits[-1].log_softmax(-1), margins[-1]))
    out.update(_greedy(steps))
    return out


def _greedy(steps: list[tuple[int, torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    lps = torch.stack([s[1] for s in steps])
    chosen = torch.tensor([s[0] for s in steps])
    ids, top = _topk(lps)
    return {
        "greedy_ids": chosen,
        "greedy_logprob": lps.gather(-1, chosen.unsqueeze(-1)).squeeze(-1),
        "greedy_top2_gap": top[:, 0] - top[:, 1],
        "greedy_topk_ids": ids,
        "greedy_topk_logprobs": top,
        "greedy_margins": torch.stack([s[2] for s in steps]),
    }
