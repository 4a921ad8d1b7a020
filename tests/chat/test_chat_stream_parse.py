"""The incremental completion parser: however the text is cut, it returns what parse_completion returns
(well-formed text), and the same as for the whole text (any text)."""

from __future__ import annotations

import random

import pytest

from deepinfer_core.chat import parse_completion
from deepinfer_core.chat.dsml import V41_TAGS, render_tool_calls
from deepinfer_core.chat.stream import CompletionParser
from deepinfer_core.chat.tokens import EOS
from deepinfer_core.chat.validate import ToolCall

BLOCK = render_tool_calls(
    [ToolCall("get_weather", {"location": "Bei\njing </", "days": 3}), ToolCall("f", {"x": [1, {"y": None}]})]
).text
WELL_FORMED = [
    ("think-high", "Let me think < about </ it.</think>The answer:\n\n" + BLOCK),
    ("think-max", "<think>reason</think>just content\n"),
    ("think-high", "no end of reasoning </th"),
    ("think-high", "r</think>\n\n\ncontent then three newlines\n\n\n" + BLOCK + "\n  "),
    ("non-think", "content only\n\n" + BLOCK + EOS),
    ("non-think", "a < b and <｜DS? no, plain text"),
    ("non-think", ""),
]
_BAD_INVOKE = BLOCK.replace("</｜DSML｜invoke>", "x</｜DSML｜invoke>", 1)
_HALF = BLOCK[: len(BLOCK) // 2]
_GARBAGE = BLOCK.replace("\n<｜DSML｜invoke", "\ngarbage<｜DSML｜invoke", 1)
_EMPTY = "<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>"
MALFORMED = [  # (mode, text, expected content, expected number of calls)
    ("non-think", "text\n\n" + _BAD_INVOKE, "text\n\n" + _BAD_INVOKE, 0),
    ("non-think", "text\n\n" + _HALF, "text\n\n" + _HALF, 0),
    ("non-think", "text\n\n" + _GARBAGE, "text\n\n" + _GARBAGE, 0),
    ("think-high", "r</think>\n\n" + _EMPTY, "\n\n" + _EMPTY, 0),
    ("non-think", "text\n\n" + BLOCK + " trailing words", "text trailing words", 2),
]


def _run(mode: str, text: str, cuts: list[int], encoding: str = "deepseek_v4") -> tuple[str, str, list]:
    p = CompletionParser(mode, parse_tools=True, encoding=encoding)
    bounds = [0, *sorted(cuts), len(text)]
    parts = [p.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])] + [p.finish()]
    return (
        "".join(x.reasoning for x in parts),
        "".join(x.content for x in parts),
        [c for x in parts for c in x.tool_calls],
    )


def _chunkings(text: str, seed: int, n: int = 150):
    rng = random.Random(seed)
    yield list(range(1, len(text)))  # one character at a time
    for _ in range(n):
        yield [rng.randrange(len(text) + 1) for _ in range(rng.randrange(1, 10))]


V41_BLOCK = render_tool_calls([ToolCall("get_time", {"zone": "UTC"})], V41_TAGS).text
V41_WELL_FORMED = [
    ("think", "effort spent < here</think>Answer:\n\n" + V41_BLOCK),
    ("non-think", "plain\n\n" + V41_BLOCK + "\n"),
    ("think-max", "no tools</think>done"),
]


@pytest.mark.parametrize(
    "encoding, mode, text",
    [("deepseek_v4", m, t) for m, t in WELL_FORMED] + [("deepseek_v41", m, t) for m, t in V41_WELL_FORMED],
)
def test_any_chunking_gives_what_parse_completion_gives(encoding, mode, text):
    ref = parse_completion(text.removesuffix(EOS), mode, encoding=encoding)
    want = (ref["reasoning_content"] or "", ref["content"], ref["tool_calls"])
    for cuts in _chunkings(text, seed=len(text)):
        assert _run(mode, text.removesuffix(EOS), cuts, encoding) == want, cuts


def test_v4_tags_are_plain_content_for_v41():
    """Each encoding parses its own tags only: V4's block in a V4.1 completion stays content."""
    reasoning, content, calls = _run("non-think", "x\n\n" + BLOCK, [], "deepseek_v41")
    assert (content, calls) == ("x\n\n" + BLOCK, [])


@pytest.mark.parametrize("mode, text, content, num_calls", MALFORMED)
def test_malformed_blocks_come_back_as_content_whatever_the_chunking(mode, text, content, num_calls):
    whole = _run(mode, text, [])
    assert whole[1] == content and len(whole[2]) == num_calls
    for cuts in _chunkings(text, seed=len(text)):
        assert _run(mode, text, cuts) == whole, cuts


def test_nothing_that_could_become_a_marker_is_returned_early():
    p = CompletionParser("think-high", parse_tools=True)
    assert p.feed("abc</th").reasoning == "abc"
    assert p.feed("ink>content\n").content == "content"
    assert p.feed("\n<｜DS").content == ""
    assert p.feed("ML｜tool_calls>").content == ""
    assert p.finish().content == "\n\n<｜DSML｜tool_calls>"  # a block that never came: verbatim


def test_without_tools_dsml_is_plain_content():
    p = CompletionParser("non-think", parse_tools=False)
    assert p.feed("x\n\n" + BLOCK).content + p.finish().content == "x\n\n" + BLOCK
