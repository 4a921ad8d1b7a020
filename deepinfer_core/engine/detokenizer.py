"""Incremental detokenization and stop-string matching.

Text is produced token by token: each new token's text is the difference between decoding a short run
of recent ids with and without it, so multi-byte characters and tokenizers that merge across token
boundaries come out right, and a trailing U+FFFD (an incomplete UTF-8 sequence) waits for the next token.
"""

from __future__ import annotations

from typing import Any, Protocol

#: prompt tokens decoded ahead of the first output token, as context for the first pieces
_CONTEXT = 5


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def make_detokenizer(tokenizer: Any, prompt_ids: list[int], skip_special_tokens: bool):
    """The Rust ``DecodeStream`` of a fast (``tokenizers``) tokenizer, else the generic decoder."""
    backend = getattr(tokenizer, "_tokenizer", None)
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream

        if isinstance(backend, Tokenizer):
            return _StreamDetokenizer(
                backend,
                DecodeStream(ids=list(prompt_ids[-_CONTEXT:]), skip_special_tokens=skip_special_tokens),
            )
    except (ImportError, TypeError):  # tokenizers too old for DecodeStream(ids=...)
        pass
    return IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)


class _StreamDetokenizer:
    def __init__(self, backend: Any, stream: Any):
        self.backend, self.stream = backend, stream

    def add(self, token: int) -> str:
        return self.stream.step(self.backend, token) or ""


class IncrementalDetokenizer:
    """Works with any tokenizer that has ``decode(ids, skip_special_tokens=...)``."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int], skip_special_tokens: bool):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids = list(prompt_ids[-_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token: int) -> str:
        """Append ``token``; returns the text it completes (possibly empty)."""
        self.ids.append(token)
        before = self.tok.decode(
            self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip
        )
        after = self.tok.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]


def find_stop(text: str, new_len: int, stops: list[str]) -> tuple[int, str] | None:
    """Earliest stop string in ``text`` that ends within its last ``new_len`` characters:
    ``(start index, stop string)`` or None."""
    if not stops or not new_len:
        return None
    longest = max(len(s) for s in stops)
    lo = max(0, len(text) - new_len - longest + 1)
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, lo)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best
