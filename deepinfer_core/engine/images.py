"""A step's image rows: which rows of the flattened step lie in an image span, and the embeddings that
replace their token embeddings.

A request's images are encoded by the model's tower once, the first time a step schedules rows of any of
its spans (all of its images in one tower pass), and kept on the request while its prompt's image rows are
being computed. A prefill chunk may end inside a span: the chunk takes that span's rows for its positions
only, and the next chunk the rest. Once a step has scheduled the prompt through the end of its last span,
the embeddings are dropped; a later step that needs span rows again (a preempted request recomputing its
prompt, a sample that recomputes a partial block) encodes them again (re-encode, not keep: no embedding
memory is held by running or preempted requests after their prefill).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deepinfer_core.models.base import CausalLM


def step_images(model: CausalLM, scheduled: Sequence) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(rows [N] int64 on the host, embeds [N, hidden] on the device)`` for the step's scheduled sequences
    (each a ``ScheduledSeq``: ``seq``, ``start``, ``num_tokens``), or None when no row is in a span."""
    rows: list[torch.Tensor] = []
    embeds: list[torch.Tensor] = []
    base = 0
    for s in scheduled:
        req, start, end = s.seq.request, s.start, s.start + s.num_tokens
        if req.images and start < req.images[-1].end:
            if req.image_embeds is None:
                req.image_embeds = model.encode_images([span.image for span in req.images])
            for span, emb in zip(req.images, req.image_embeds):
                lo, hi = max(start, span.start), min(end, span.end)
                if lo < hi:
                    rows.append(torch.arange(base + lo - start, base + hi - start))
                    embeds.append(emb[lo - span.start : hi - span.start])
            if end >= req.images[-1].end:
                req.image_embeds = None
        base += s.num_tokens
    if not rows:
        return None
    return torch.cat(rows), torch.cat(embeds)
