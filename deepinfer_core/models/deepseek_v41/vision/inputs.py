"""A request's images as the model consumes them: each image's place in the prompt and its content digest.

DeepSeek's ``prepare_vl_inputs`` rule: every ``image_token_id`` in the tokenized prompt is one image's
placeholder, and is replaced by that image's span, ``plan.num_tokens`` positions that all carry
``image_token_id`` (the span's types, START / IMAGE / NEW_LINE / END, travel out of band). The number of
placeholders must equal the number of images.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from deepinfer_core.models.deepseek_v41.vision.config import VisionConfig
from deepinfer_core.models.deepseek_v41.vision.image_processor import (
    ImageInputError,
    ProcessedImage,
    process_image,
)


@dataclass(frozen=True)
class ImageSpan:
    """One image of a request: its span starts at prompt position ``start`` and has ``image.plan.num_tokens``
    positions. ``digest``: sha256 of the preprocessed patches (what the tower reads), for prefix caching."""

    start: int
    image: ProcessedImage
    digest: bytes

    @property
    def end(self) -> int:
        return self.start + self.image.types.numel()


def digest(image: ProcessedImage) -> bytes:
    data = image.patches.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    h = hashlib.sha256(data)
    h.update(repr((image.plan.n_vit_h, image.plan.n_vit_w)).encode())
    return h.digest()


def expand_placeholders(
    token_ids: Sequence[int], images: Sequence[object], cfg: VisionConfig
) -> tuple[list[int], list[ImageSpan]]:
    """Preprocess ``images`` (PIL images or encoded bytes) and replace the ``i``-th placeholder of
    ``token_ids`` by image ``i``'s span. Raises :class:`ImageInputError` naming the image and the problem."""
    marker = cfg.image_token_id
    count = sum(1 for t in token_ids if t == marker)
    if count != len(images):
        raise ImageInputError(
            f"the prompt has {count} image placeholder(s) (token id {marker}) but {len(images)} image(s) "
            "were given; put one placeholder where each image goes"
        )
    out: list[int] = []
    spans: list[ImageSpan] = []
    for t in token_ids:
        if t != marker:
            out.append(t)
            continue
        i = len(spans)
        try:
            processed = process_image(images[i], cfg)
        except ImageInputError as e:
            raise ImageInputError(f"image {i}: {e}") from None
        spans.append(ImageSpan(len(out), processed, digest(processed)))
        out += [marker] * processed.types.numel()
    return out, spans
