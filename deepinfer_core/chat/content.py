"""Message content given as a list of parts (``[{"type": "text", "text": ...}, ...]``), for V4.1.

V4.1's encoding turns each message's text parts into blocks: a user message's blocks become part of
its user turn, joined by a blank line with the turn's other blocks; any other message's text is its
text parts joined by a blank line. So ``[]`` is no text at all, which is not the same as ``[{"type":
"text", "text": ""}]`` (an empty block still takes a blank-line separator in a merged user turn).

Image parts (``image``, ``image_url``) become image placeholders in V4.1's encoding; images are not
supported yet, so they are refused, as is every other part type the encoding has no rule for.
"""

from __future__ import annotations

from typing import Any

IMAGE_PART_TYPES = ("image", "image_url")


def text_parts(raw: Any, where: str) -> tuple[str, ...]:
    """The texts of a list of content parts, in order; ``where`` names the field in errors."""
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a string or a list of content parts; got {type(raw).__name__}")
    return tuple(_text(part, f"{where}[{k}]") for k, part in enumerate(raw))


def _text(part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise ValueError(f'{where} must be a content part like {{"type": "text", "text": "..."}}')
    kind = part.get("type")
    if kind in IMAGE_PART_TYPES:
        raise ValueError(f"{where}: image parts are not supported yet; send the text parts only")
    if kind != "text":
        raise ValueError(f"{where}.type must be 'text'; got {kind!r}")
    text = part.get("text")
    if not isinstance(text, str):
        raise ValueError(f"{where}.text must be a string; got {type(text).__name__}")
    return text
