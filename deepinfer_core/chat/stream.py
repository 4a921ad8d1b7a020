"""Parsing an assistant turn while it is generated: reasoning, content and tool calls as they arrive.

:class:`CompletionParser` is fed text pieces and returns what each piece completes. For a well-formed
completion the pieces add up to exactly what :func:`~deepinfer_core.chat.parse.parse_completion`
returns for the whole text, however the text is cut; a whole text fed at once gives the same result as
the same text fed piece by piece, so a server's streamed and non-streamed answers agree.

Text that could still turn into a marker is held back until it is decided: the start of ``</think>``
while reasoning; while tool calls are enabled, the start of the block's tag (V4's ``<｜DSML｜tool_calls>``,
V4.1's ``<｜DSML｜ calls>``) and the blank line
that separates content from the block. So no DSML fragment ever reaches ``content`` when the model
writes a well-formed block. A call is returned as soon as its ``</｜DSML｜invoke>`` arrives.

Unlike ``parse_completion`` the parser never raises: a model that writes a malformed block (text
between elements, a bad ``string`` flag, a block cut off by ``max_tokens``) gets the calls parsed up to
that point, and the rest of the block is returned as content, verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepinfer_core.chat.dsml import parse_tool_calls
from deepinfer_core.chat.encodings import ChatEncoding, get_encoding
from deepinfer_core.chat.tokens import THINK_END, THINK_START


@dataclass
class ParsedDelta:
    reasoning: str = ""
    content: str = ""
    #: complete calls, ``{"type": "function", "function": {"name", "arguments"}}``
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class CompletionParser:
    """Incremental :func:`parse_completion` of one encoding (its thinking modes and DSML tags);
    ``parse_tools=False`` treats DSML as plain content."""

    def __init__(
        self,
        thinking_mode: str = "non-think",
        parse_tools: bool = False,
        *,
        encoding: str | ChatEncoding = "deepseek_v4",
    ):
        enc = get_encoding(encoding)
        self._phase = "reasoning" if enc.resolve_mode(thinking_mode).thinking else "content"
        self._tags = enc.tags
        self._parse_tools = parse_tools
        self._buf = ""  # text not yet returned
        self._at_start = True  # a leading <think> is still possible
        self._sep = ""  # the blank line dropped before the block (returned if the block is malformed)
        self.num_tool_calls = 0

    def feed(self, text: str) -> ParsedDelta:
        self._buf += text
        out = ParsedDelta()
        self._advance(out, final=False)
        return out

    def finish(self) -> ParsedDelta:
        """Everything still held back, once the completion has ended."""
        out = ParsedDelta()
        self._advance(out, final=True)
        if self._phase == "tools":  # the block never closed
            self._fallback()
            self._advance(out, final=True)
        return out

    def _advance(self, out: ParsedDelta, final: bool) -> None:
        if self._phase == "reasoning":
            self._reasoning(out, final)
        if self._phase == "content":
            self._content(out, final)
        if self._phase == "tools":
            self._tools(out)
        if self._phase == "after":  # after the block: only whitespace belongs to it
            if not self._buf.strip():
                self._buf = "" if final else self._buf
                return
            self._phase = "raw"
        if self._phase == "raw":
            out.content += self._buf
            self._buf = ""

    def _reasoning(self, out: ParsedDelta, final: bool) -> None:
        if self._at_start:
            if not final and THINK_START.startswith(self._buf) and len(self._buf) < len(THINK_START):
                return
            self._buf = self._buf.removeprefix(THINK_START)
            self._at_start = False
        i = self._buf.find(THINK_END)
        if i >= 0:
            out.reasoning += self._buf[:i]
            self._buf = self._buf[i + len(THINK_END) :]
            self._phase = "content"
            return
        keep = 0 if final else _partial_suffix(self._buf, THINK_END)
        out.reasoning += self._buf[: len(self._buf) - keep]
        self._buf = self._buf[len(self._buf) - keep :]

    def _content(self, out: ParsedDelta, final: bool) -> None:
        if not self._parse_tools:
            out.content += self._buf
            self._buf = ""
            return
        start = self._tags.calls_start
        i = self._buf.find(start)
        if i >= 0:
            head = self._buf[:i]
            cut = head.removesuffix("\n\n")
            out.content += cut
            self._sep = head[len(cut) :]
            self._buf = self._buf[i + len(start) :]
            self._phase = "tools"
            return
        keep = 0 if final else _partial_suffix(self._buf, start)
        body = self._buf[: len(self._buf) - keep]
        newlines = len(body) - len(body.rstrip("\n"))
        keep += 0 if final else min(newlines, 2)
        out.content += self._buf[: len(self._buf) - keep]
        self._buf = self._buf[len(self._buf) - keep :]

    def _tools(self, out: ParsedDelta) -> None:
        """Consume complete invoke elements; stop at the block's end or at the first malformed text."""
        tags = self._tags
        while True:
            rest = self._buf.lstrip()
            if rest.startswith(tags.invoke_open):
                end = rest.find(tags.invoke_end)
                if end < 0:
                    return
                element = rest[: end + len(tags.invoke_end)]
                try:
                    calls = parse_tool_calls(f"{tags.calls_start}\n{element}\n{tags.calls_end}", tags)
                except ValueError:
                    self._fallback()
                    return
                out.tool_calls.extend(calls)
                self.num_tool_calls += len(calls)
                self._buf = rest[len(element) :]
            elif rest.startswith(tags.calls_end) and self.num_tool_calls:
                self._buf = rest[len(tags.calls_end) :]
                self._phase = "after"
                return
            elif tags.invoke_open.startswith(rest) or (
                tags.calls_end.startswith(rest) and self.num_tool_calls
            ):
                return  # undecided until more text arrives
            else:
                self._fallback()
                return

    def _fallback(self) -> None:
        """A malformed or unfinished block: the unparsed rest is content, verbatim."""
        if not self.num_tool_calls:
            self._buf = self._sep + self._tags.calls_start + self._buf
        self._phase = "raw"
