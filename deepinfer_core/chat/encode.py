"""Tokenizing a rendered :class:`~deepinfer_core.chat.prompt.Prompt` so that only the encoder emits
control tokens.

A tokenizer turns every added-token string it finds into that token, wherever it comes from. So the
encoder's own pieces are split at added-token strings (each becomes its id, exactly as ``encode`` would),
while content is never searched for them: the text between two of the encoder's control tokens, content
included, goes through the tokenizer's normalizer, pre-tokenizer and model only, the pipeline ``encode``
runs on such text. For content that spells no control token the ids therefore equal
``tokenizer.encode(prompt.text, add_special_tokens=False)``; content that does spell one is encoded as the
plain characters it is (``<｜Assistant｜>`` becomes ``<``, ``｜``, ``Assistant`` ... pieces).
"""

from __future__ import annotations

import re
from typing import Any

from deepinfer_core.chat.prompt import Prompt


class ContentTokenError(ValueError):
    """Content spells a control token, and this tokenizer cannot encode it as plain text."""


def encode_prompt(prompt: Prompt, tokenizer: Any, *, special_tokens_in_content: bool = False) -> list[int]:
    """The token ids of ``prompt``. ``special_tokens_in_content=True`` is the opt-in for callers who want
    control-token text inside messages to become control tokens (it tokenizes the joined text)."""
    if special_tokens_in_content:
        return list(tokenizer.encode(prompt.text, add_special_tokens=False))
    get_added = getattr(tokenizer, "get_added_vocab", None)
    added: dict[str, int] = get_added() if get_added is not None else {}
    marker = (
        re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))) if added else None
    )
    plain = _plain_encoder(tokenizer, added)
    ids: list[int] = []
    run: list[str] = []
    for text, is_content in prompt.pieces:
        pos = 0
        if not is_content and marker is not None:
            for m in marker.finditer(text):
                run.append(text[pos : m.start()])
                ids += plain("".join(run))
                run.clear()
                ids.append(added[m.group()])
                pos = m.end()
        run.append(text[pos:])
    ids += plain("".join(run))
    return ids


def _plain_encoder(tokenizer: Any, added: dict[str, int]):
    """Text -> ids without matching added tokens: the fast tokenizer's pipeline stages, or (for a tokenizer
    without one) ``encode`` after checking that the text spells no added token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:

        def checked(text: str) -> list[int]:
            hit = next((t for t in added if t in text), None)
            if hit is not None:
                raise ContentTokenError(
                    f"message content contains the control-token text {hit!r}, which this tokenizer cannot "
                    "encode as plain text; remove it or opt in with special_tokens_in_content=True"
                )
            return list(tokenizer.encode(text, add_special_tokens=False)) if text else []

        return checked

    def pipeline(text: str) -> list[int]:
        if not text:
            return []
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer else [(text, None)]
        return [tok.id for piece, _ in pieces for tok in backend.model.tokenize(piece)]

    return pipeline
