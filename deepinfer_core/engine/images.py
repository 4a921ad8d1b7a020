"""A step's image rows: which rows of the flattened step lie in an image span, and the embeddings that
replace their token embeddings.

An image is encoded by the model's tower once, in the first step that schedules rows of its span (not before,
and not with the request's other images), and its embeddings are kept on the request until a step schedules
the span's last row; then they are dropped. A prefill chunk may end inside a span: the chunk takes that
span's rows for its positions only, and the next chunk the rest. A later step that needs span rows again (a
preempted request recomputing its prompt, a sample that recomputes a partial block) encodes that image
again (re-encode, not keep: no embedding memory is held by running or preempted requests after their
prefill).

**Budget.** The images a step needs are encoded in tower passes of at most ``max_encoder_patches`` ViT
patches (images packed in order while they fit; one image is never split; ``None``: one image a pass), so
the tower's activations are bounded by the setting, whatever the batch. The input processor refuses an image
with more patches than that, and the request fails alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deepinfer_core.models.base import CausalLM


def step_images(
    model: CausalLM, scheduled: Sequence, max_encoder_patches: int | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(rows [N] int64 on the host, embeds [N, hidden] on the device)`` for the step's scheduled sequences
    (each a ``ScheduledSeq``: ``seq``, ``start``, ``num_tokens``), or None when no row is in a span."""
    needed = []  # (request, image index) whose rows this step schedules and that are not encoded
    for s in scheduled:
        req, start, end = s.seq.request, s.start, s.start + s.num_tokens
        for k, span in enumerate(req.images):
            if span.start < end and start < span.end and k not in req.image_embeds:
                if (req, k) not in needed:
                    needed.append((req, k))
    images = [req.images[k].image for req, k in needed]
    for group in encoder_passes(images, max_encoder_patches):
        for g, emb in zip(group, model.encode_images([images[g] for g in group]), strict=True):
            req, k = needed[g]
            req.image_embeds[k] = emb
    rows: list[torch.Tensor] = []
    embeds: list[torch.Tensor] = []
    base = 0
    for s in scheduled:
        req, start, end = s.seq.request, s.start, s.start + s.num_tokens
        for k, span in enumerate(req.images):
            lo, hi = max(start, span.start), min(end, span.end)
            if lo < hi:
                emb = req.image_embeds[k]
                rows.append(torch.arange(base + lo - start, base + hi - start))
                embeds.append(emb[lo - span.start : hi - span.start])
        base += s.num_tokens
    for s in scheduled:  # a span whose last row this step schedules is done
        req, end = s.seq.request, s.start + s.num_tokens
        for k, span in enumerate(req.images):
            if end >= span.end:
                req.image_embeds.pop(k, None)
    if not rows:
        return None
    return torch.cat(rows), torch.cat(embeds)


def encoder_passes(images: Sequence, max_patches: int | None) -> list[list[int]]:
    """Indices of ``images`` (each with ``patches [n, ...]``) grouped into tower passes of at most
    ``max_patches`` patches, in order; ``None``: one image a pass. An image over the budget gets a pass of
    its own (the input processor refuses such images before they get here)."""
    passes: list[list[int]] = []
    used = 0
    for i, im in enumerate(images):
        n = im.patches.shape[0]
        if max_patches is None or not passes or used + n > max_patches:
            passes.append([i])
            used = n
        else:
            passes[-1].append(i)
            used += n
    return passes
