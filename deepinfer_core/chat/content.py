"""Message content given as a list of parts (``[{"type": "text", "text": ...}, ...]``), for V4.1.

V4.1's encoding turns each message's text parts into blocks: a user message's blocks become part of
its user turn, joined by a blank line with the turn's other blocks; any other message's text is its
text parts joined by a blank line. So ``[]`` is no text at all, which is not the same as ``[{"type":
"text", "text": ""}]`` (an empty block still takes a blank-line separator in a merged user turn).

An ``image_url`` part becomes a block of its own holding the image placeholder (DeepSeek's encoding turns
an image block into a text block ``<｜deepseek_image｜>``), in user messages only; the image itself travels
beside the prompt (:func:`image_urls`). Only ``data:`` URLs with base64 payloads are accepted: remote
``http(s)`` URLs are not fetched and local paths are not read (DeepSeek's ``load_image_bytes`` does both).
Every other part type the encoding has no rule for is refused.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

IMAGE_PART_TYPES = ("image", "image_url")


@dataclass(frozen=True)
class ImagePart:
    """An ``image_url`` content part: where the image placeholder goes; ``url`` is its ``data:`` URL."""

    url: str


def text_parts(raw: Any, where: str) -> tuple[str | ImagePart, ...]:
    """The text (and image) parts of a list of content parts, in order; ``where`` names the field in errors."""
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a string or a list of content parts; got {type(raw).__name__}")
    return tuple(_part(part, f"{where}[{k}]") for k, part in enumerate(raw))


def image_url_bytes(url: Any, where: str) -> bytes:
    """The encoded image of a ``data:<type>;base64,<payload>`` URL; any other URL is refused, clearly."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"{where}.image_url.url must be a non-empty string")
    if url.startswith(("http://", "https://")):
        raise ValueError(
            f"{where}: remote image URLs are not fetched ({url[:60]!r}); send the image inline as "
            "a data:image/png;base64,... URL"
        )
    if not url.startswith("data:"):
        raise ValueError(
            f"{where}: only data: URLs are accepted, not local paths or other schemes ({url[:60]!r}); send "
            "the image inline as a data:image/png;base64,... URL"
        )
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ValueError(f"{where}: a data: URL must be base64 ({header[:60]!r}): data:<type>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"{where}: the data: URL's base64 payload is invalid: {e}") from None


def image_urls(messages: Any) -> list[tuple[str, str]]:
    """``(url, where)`` of every ``image_url`` part of the user messages, in prompt order."""
    out = []
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        if m.get("role") == "user" and isinstance(content, list):
            for k, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    out.append((_url(part), f"messages[{i}].content[{k}]"))
    return out


def _url(part: dict) -> Any:
    image_url = part.get("image_url")
    return image_url.get("url") if isinstance(image_url, dict) else image_url


def _part(part: Any, where: str) -> str | ImagePart:
    if not isinstance(part, dict):
        raise ValueError(f'{where} must be a content part like {{"type": "text", "text": "..."}}')
    kind = part.get("type")
    if kind == "image_url":
        url = _url(part)
        if not isinstance(url, str) or not url:
            raise ValueError(f'{where}.image_url must be {{"url": "data:image/...;base64,..."}}')
        return ImagePart(url)
    if kind == "image":
        raise ValueError(
            f'{where}: use {{"type": "image_url", "image_url": {{"url": "data:..."}}}} for images'
        )
    if kind != "text":
        raise ValueError(f"{where}.type must be 'text'; got {kind!r}")
    text = part.get("text")
    if not isinstance(text, str):
        raise ValueError(f"{where}.text must be a string; got {type(text).__name__}")
    return text
