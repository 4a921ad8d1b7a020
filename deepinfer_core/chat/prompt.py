"""A rendered prompt as pieces: the encoder's own text, or content that came with the messages.

Content (message text, reasoning, tool results, tool names and arguments, tool schemas) must never
become a control token, whatever it spells; the encoder's own pieces (markers such as ``<｜User｜>`` and
the fixed prompts) are the only place control tokens come from. Joining the pieces gives the same text
as rendering a plain string.
"""

from __future__ import annotations


class Prompt:
    """An append-only list of ``(text, is_content)`` pieces."""

    def __init__(self) -> None:
        self.pieces: list[tuple[str, bool]] = []

    def own(self, text: str) -> Prompt:
        """Append the encoder's own text (markers and fixed prompts)."""
        if text:
            self.pieces.append((text, False))
        return self

    def content(self, text: str) -> Prompt:
        """Append text that came from the caller: it is tokenized as plain text."""
        if text:
            self.pieces.append((text, True))
        return self

    def extend(self, other: Prompt) -> Prompt:
        self.pieces.extend(other.pieces)
        return self

    def __bool__(self) -> bool:
        return bool(self.pieces)

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.pieces)
