"""The prompts of a config: BOS, then seeded random ids, one per length; and one tokenised text prompt.

Random ids avoid the three special tokens and the DSpark noise token. The text prompt is the tokenizer's
training text (case, accent and whitespace variants), so Engram sees n-grams whose compressed ids collide.
"""

from __future__ import annotations

import torch

from .configs import TinySpec
from .tokenizer import CORPUS

TEXT_PROMPT_TOKENS = 96


def random_prompt(spec: TinySpec, length: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(spec.seed * 7919 + length)
    return [0] + torch.randint(3, vocab - 1, (length - 1,), generator=g).tolist()


def text_prompt(tok) -> list[int]:
    return [0] + tok.encode("".join(CORPUS)).ids[: TEXT_PROMPT_TOKENS - 1]


def prompts(spec: TinySpec, tok) -> list[list[int]]:
    """Every prompt of ``spec``: one per ``prompt_lengths`` entry, then the text prompt."""
    vocab = tok.get_vocab_size()
    return [random_prompt(spec, n, vocab) for n in spec.prompt_lengths] + [text_prompt(tok)]


def dspark_contexts(spec: TinySpec, tok) -> list[list[int]]:
    """A short context inside the window and one that wraps the DSpark window ring."""
    return [random_prompt(spec, 5, tok.get_vocab_size()), text_prompt(tok)[: 3 * spec.window_size - 1]]
