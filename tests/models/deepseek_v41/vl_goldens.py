"""The committed V4.1 image goldens (``tests/data/v41_vision/logprobs``, written by
``tools/v41_vision_goldens.py --parts logprobs``): DeepSeek's reference model with the vision port, on a tiny
checkpoint with a vision tower; and the engine inputs that give the same prompts."""

from __future__ import annotations

import io
import json
from functools import cache
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file

DATA = Path(__file__).resolve().parents[2] / "data" / "v41_vision" / "logprobs"
CHECKPOINT = DATA / "checkpoint"


@cache
def goldens() -> tuple[dict[str, torch.Tensor], dict]:
    return load_file(str(DATA / "prompts.safetensors")), json.loads((DATA / "prompts.json").read_text())


def image_token_id() -> int:
    return json.loads((CHECKPOINT / "config.json").read_text())["image_token_id"]


def image(name: str) -> Image.Image:
    g, _ = goldens()
    return Image.open(io.BytesIO(g[f"image.{name}"].numpy().tobytes()))


def image_names(i: int) -> list[str]:
    _, meta = goldens()
    names = {n for n, *_ in meta["images"]}
    return [p for p in meta["prompts"][i]["pieces"] if p in names]


def expanded_ids(i: int) -> list[int]:
    return goldens()[0][f"{i}.ids"].tolist()


def placeholder_ids(i: int) -> list[int]:
    """Prompt ``i`` with each image span collapsed back into one placeholder."""
    ids, out, pos = expanded_ids(i), [], 0
    for start, n in goldens()[1]["prompts"][i]["spans"]:
        out += ids[pos:start] + [image_token_id()]
        pos = start + n
    return out + ids[pos:]


def engine_input(i: int, images: list[Image.Image] | None = None) -> dict:
    """``{"prompt_token_ids", "multi_modal_data"}`` for prompt ``i`` (its own images unless ``images``)."""
    item: dict = {"prompt_token_ids": placeholder_ids(i)}
    images = [image(n) for n in image_names(i)] if images is None else images
    if images:
        item["multi_modal_data"] = {"image": images}
    return item


def num_prompts() -> int:
    return len(goldens()[1]["prompts"])


def logprob_diffs(i: int, out) -> torch.Tensor:
    """``|engine - reference|`` of every prompt position's logprob of the next prompt token."""
    ids = expanded_ids(i)
    got = torch.tensor([out.prompt_logprobs[t + 1][ids[t + 1]].logprob for t in range(len(ids) - 1)])
    return (got - goldens()[0][f"{i}.logprob"]).abs()
