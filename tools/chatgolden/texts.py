"""Random message text for the chat goldens: many scripts, whitespace, code and JSON-looking text.

``markers=True`` mixes in text that spells the encodings' control tokens; such a conversation still
renders (content is only text), but it cannot round-trip through the parser or tokenize to the same ids
as its prompt string, so the tests use those conversations for the rendering comparison only.
"""

from __future__ import annotations

import random

WORDS = (
    "the",
    "weather",
    "in",
    "Paris",
    "is",
    "sunny",
    "today",
    "please",
    "check",
    "answer",
    "step",
    "北京",
    "天气",
    "你好",
    "温泉",
    "计算",
    "東京",
    "こんにちは",
    "안녕하세요",
    "café",
    "naïve",
    "Ångström",
    "Привет",
    "мир",
    "مرحبا",
    "שלום",
    "नमस्ते",
    "ελληνικά",
    "∑∫√",
    "½",
    "ｆｕｌｌ",
    "e\u0301",
    "👩\u200d💻",
    "😀",
    "🚀",
    "🇫🇷",
    "a\u00a0b",
    "x\u200by",
    "1,234.5",
    "-42",
    "3.14",
    "0x1F",
    "$PARAMETER_VALUE",
)
SNIPPETS = (
    '{"a": 1, "b": [true, null]}',
    "def f(x):\n    return x * 2\n",
    "<b>bold</b>",
    "a < b > c",
    '"quoted"',
    "back\\slash",
    "literal \\n escape",
    "`code`",
    "{content}",
    "{{braces}}",
    "%s %d",
    "| col | col |\n| --- | --- |",
    "- item\n- item",
    "# Title",
    "<tool_result>",
    "</tool_result>",
    'name="x"',
    'string="true"',
    "http://example.com/?q=1&r=2",
    "tab\tseparated",
    "line\r\nbreak",
)
SPACES = ("", "", "", " ", "  ", "\n", "\n\n", "\t", " \n ")
MARKERS_V4 = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜DSML｜tool_calls>",
    "<｜latest_reminder｜>",
)
MARKERS_V41 = MARKERS_V4 + ("<｜System｜>", "<｜DSML｜ calls>", "</｜DSML｜ parameter>")


def text(rng: random.Random, markers: tuple[str, ...] = (), max_words: int = 12) -> str:
    """A random text, sometimes empty, with leading/trailing whitespace and line breaks."""
    if rng.random() < 0.04:
        return ""
    pieces = []
    for _ in range(rng.randint(1, max_words)):
        r = rng.random()
        if markers and r < 0.08:
            pieces.append(rng.choice(markers))
        elif r < 0.22:
            pieces.append(rng.choice(SNIPPETS))
        else:
            pieces.append(rng.choice(WORDS))
        pieces.append(rng.choice((" ", " ", " ", "\n", "", "\n\n", ", ")))
    return rng.choice(SPACES) + "".join(pieces).rstrip(" ") + rng.choice(SPACES)


def nonempty_text(rng: random.Random, markers: tuple[str, ...] = ()) -> str:
    while True:
        t = text(rng, markers)
        if t:
            return t


def json_value(rng: random.Random, depth: int = 0):
    """A random JSON value: strings (multi-line, unicode), numbers, booleans, null, nested arrays/objects."""
    r = rng.random()
    if depth < 3 and r < 0.12:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3 and r < 0.24:
        return {key(rng): json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if r < 0.55:
        return text(rng, max_words=5)
    return rng.choice((0, 1, -7, 42, 2**53, -(2**31), 0.5, -1.25e-7, 3.14, 1e21, True, False, None))


def key(rng: random.Random) -> str:
    return rng.choice(
        ("city", "days", "query", "q", "limit", "options", "城市", "unit", "x y", "a-b", "n_1", "é")
    )
