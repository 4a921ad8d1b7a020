"""DSpark drafts from the reference, driven the way its ``model.py`` ``__main__`` drives ``forward_spec``.

Protocol for a context of ``L`` tokens (greedy everywhere; the release never verifies drafts):

1. ``Transformer.forward(context, 0)`` gives the greedy next token ``y`` and ``main_hidden`` (for each target
   layer, the mean over the mHC streams of that layer's input, concatenated: ``[1, L, D * n_targets]``);
2. ``forward_spec(y, main_hidden, 0)`` only seeds every stage's window KV with the projected context;
3. for each step ``s`` (position ``p = L + s``): ``Transformer.forward([fed_s], p)`` with ``fed_s`` the
   previous greedy token gives the next greedy token ``y_s`` and that position's ``main_hidden``;
   ``forward_spec(y_s, main_hidden, p)`` writes position ``p`` into the stages' windows and drafts a block
   from ``[y_s, noise, ..., noise]`` at positions ``p+1 .. p+B``: ``B`` tokens for positions ``p+2 .. p+B+1``.

Recorded per step (``S`` steps, block ``B``, ``K`` = :data:`TOPK`): ``fed_ids`` ``[S]``, ``draft_input_ids``
``[S]`` (``y_s``), ``draft_ids`` ``[S, B]``, ``draft_logprob`` ``[S, B]`` (of each drafted token under its slot's
logits, Markov bias included), ``draft_top2_gap`` ``[S, B]``, ``draft_topk_ids`` / ``draft_topk_logprobs``
``[S, B, K]`` and ``confidence`` ``[S, B]`` (the confidence head's raw output).
"""

from __future__ import annotations

import torch

TOPK = 8


def _step_record(draft_input: int, result) -> dict[str, torch.Tensor]:
    output_ids, logits, confidence = result
    lp = logits[0].float().log_softmax(-1)
    drafted = output_ids[0, 1:].long()
    top_v, top_i = lp.topk(TOPK, dim=-1)
    return {
        "draft_input_ids": torch.tensor(draft_input),
        "draft_ids": drafted,
        "draft_logprob": lp.gather(-1, drafted.unsqueeze(-1)).squeeze(-1),
        "draft_top2_gap": top_v[:, 0] - top_v[:, 1],
        "draft_topk_ids": top_i.int(),
        "draft_topk_logprobs": top_v,
        "confidence": confidence[0].float(),
    }


@torch.inference_mode()
def drafts(model, context: list[int], steps: int) -> dict[str, torch.Tensor]:
    """Run the protocol above on the reference ``model``; returns the per-step records stacked."""
    next_id, _, main_hidden = model(torch.tensor([context]), 0)
    assert model.forward_spec(next_id, main_hidden, 0) is None
    fed, records = int(next_id[0]), []
    fed_ids = []
    for s in range(steps):
        fed_ids.append(fed)
        next_id, _, main_hidden = model(torch.tensor([[fed]]), len(context) + s)
        y = int(next_id[0])
        records.append(_step_record(y, model.forward_spec(next_id, main_hidden, len(context) + s)))
        fed = y
    out = {k: torch.stack([r[k] for r in records]) for k in records[0]}
    out["fed_ids"] = torch.tensor(fed_ids)
    return out
