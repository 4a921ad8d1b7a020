"""``POST /v1/chat/completions``: the DeepSeek-V4 chat encoding behind OpenAI's chat API.

Each choice's text goes through one :class:`~deepinfer_core.chat.stream.CompletionParser`, fed the
whole text (non-streamed) or each delta (streamed), so both give the same message: ``reasoning_content``
(thinking modes), ``content``, and DSML tool calls as ``tool_calls`` (``finish_reason="tool_calls"``).
Chat requests keep special tokens in the text by default (``skip_special_tokens=False``): ``</think>``
and the DSML markers are added tokens the parser must see. Logprobs cover every generated token,
reasoning included.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from deepinfer_core.chat import ChatEncoding, get_encoding
from deepinfer_core.chat.stream import CompletionParser, ParsedDelta
from deepinfer_core.engine.async_llm import CompletionDelta
from deepinfer_core.engine.outputs import CompletionOutput
from deepinfer_core.serve.chat_prompt import Mode, encode, offered_tools, render, thinking_mode
from deepinfer_core.serve.errors import ApiError, bad_request
from deepinfer_core.serve.logprobs import chat_logprobs
from deepinfer_core.serve.protocol import ChatCompletionRequest
from deepinfer_core.serve.responses import (
    SSE_DONE,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessage,
    ChatStreamChoice,
    ChoiceLogprobs,
    FunctionCall,
    ToolCall,
    ToolCallDelta,
    Usage,
    sse,
    sse_error,
)
from deepinfer_core.serve.sampling import renames, sampling_params
from deepinfer_core.serve.serving import Serving, Submission, stream_error

_RENAMES = {"prompts": "messages", "thinking_mode": "chat_template_kwargs.thinking_mode"}


class _Chat:
    """A submitted chat request's parsing context."""

    def __init__(self, req: ChatCompletionRequest, mode: Mode, parse_tools: bool, encoding: ChatEncoding):
        self.req, self.mode, self.parse_tools, self.encoding = req, mode, parse_tools, encoding
        self.thinking = encoding.resolve_mode(mode.thinking_mode, mode.reasoning_effort).thinking

    def parser(self) -> CompletionParser:
        return CompletionParser(self.mode.thinking_mode, self.parse_tools, encoding=self.encoding)

    @property
    def top_k(self) -> int | None:
        return (self.req.top_logprobs or 0) if self.req.logprobs else None


class ChatServing(Serving):
    @cached_property
    def encoding(self) -> ChatEncoding:
        """The ``chat_encoding`` setting, or (``auto``) the checkpoint's (V4.1's for a V4.1 checkpoint)."""
        name = self.settings.chat_encoding
        return self.llm.chat_encoding if name == "auto" else get_encoding(name)

    async def submit_body(self, body: Any) -> Submission:
        start = time.perf_counter()
        req = self.parse(ChatCompletionRequest, body)
        encoding = self.encoding
        mode = thinking_mode(req, self.settings.default_thinking_mode, encoding)
        tools = offered_tools(req)
        rendered = render(req, mode, tools, encoding)
        prompt = await self.llm.run_off_loop(encode, rendered, self.llm.tokenizer, req.messages)
        ctx = _Chat(req, mode, tools is not None, encoding)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = sampling_params(
            req, self.settings, max_tokens=max_tokens, logprobs=ctx.top_k, skip_special_tokens=False
        )
        items = await self.process([prompt], [params], False, renames(req, _RENAMES))
        if items[0].error is not None:  # a bad image
            raise bad_request(items[0].error, "messages")
        self.cap_max_tokens(items)
        sub = self.submit("chatcmpl", req, items, start)
        sub.body = ctx
        return sub

    async def response(self, sub: Submission) -> dict[str, Any]:
        [out] = await self.finals(sub)
        ctx: _Chat = sub.body
        choices = [self._choice(ctx, c) for c in out.outputs]
        usage = Usage()
        usage.add(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))
        resp = ChatCompletionResponse(
            id=sub.id,
            created=sub.created,
            model=sub.model,
            choices=choices,
            usage=usage,
            prompt_token_ids=list(out.prompt_token_ids) if ctx.req.return_token_ids else None,
        )
        return resp.model_dump(mode="json")

    def _choice(self, ctx: _Chat, c: CompletionOutput) -> ChatChoice:
        parser = ctx.parser()
        parsed = parser.feed(c.text)
        rest = parser.finish()
        calls = [_tool_call(tc) for tc in parsed.tool_calls + rest.tool_calls]
        message = ChatMessage(
            content=(parsed.content + rest.content) if parsed.content + rest.content or not calls else None,
            reasoning_content=parsed.reasoning + rest.reasoning if ctx.thinking else None,
            tool_calls=calls or None,
        )
        lps = None
        if ctx.top_k is not None:
            lps = ChoiceLogprobs(content=chat_logprobs(list(c.token_ids), c.logprobs or [], ctx.top_k))
        return ChatChoice(
            index=c.index,
            message=message,
            logprobs=lps,
            finish_reason="tool_calls" if calls else c.finish_reason,
            stop_reason=c.stop_reason,
            token_ids=list(c.token_ids) if ctx.req.return_token_ids else None,
        )

    async def stream(self, sub: Submission) -> AsyncIterator[str]:
        ctx: _Chat = sub.body
        parsers = {j: ctx.parser() for j in range(ctx.req.n)}
        head = [
            ChatStreamChoice(index=j, delta=ChatDelta(role="assistant", content="")) for j in range(ctx.req.n)
        ]
        yield sse(self._chunk(sub, head))
        usage = Usage()
        try:
            async for _, d in self.deltas(sub):
                if d.finished:
                    usage.add(len(d.output.prompt_token_ids), sum(len(c.token_ids) for c in d.output.outputs))
                choices = [ch for c in d.outputs if (ch := self._stream_choice(ctx, parsers[c.index], c))]
                if choices:
                    yield sse(self._chunk(sub, choices))
        except (ApiError, RuntimeError) as e:
            sub.abort()
            yield sse_error(stream_error(e))
            yield SSE_DONE
            return
        if ctx.req.stream_options is not None and ctx.req.stream_options.include_usage:
            yield sse(self._chunk(sub, [], usage))
        yield SSE_DONE

    def _chunk(
        self, sub: Submission, choices: list[ChatStreamChoice], usage: Usage | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=sub.id, created=sub.created, model=sub.model, choices=choices, usage=usage
        )

    def _stream_choice(
        self, ctx: _Chat, parser: CompletionParser, c: CompletionDelta
    ) -> ChatStreamChoice | None:
        parsed = parser.feed(c.text)
        if c.finish_reason is not None:
            rest = parser.finish()
            parsed = ParsedDelta(
                parsed.reasoning + rest.reasoning,
                parsed.content + rest.content,
                parsed.tool_calls + rest.tool_calls,
            )
        delta = ChatDelta(
            content=parsed.content or None,
            reasoning_content=(parsed.reasoning or None) if ctx.thinking else None,
            tool_calls=_tool_call_deltas(parser.num_tool_calls - len(parsed.tool_calls), parsed.tool_calls)
            or None,
        )
        lps = None
        if ctx.top_k is not None and c.logprobs:
            lps = ChoiceLogprobs(content=chat_logprobs(c.token_ids, c.logprobs, ctx.top_k))
        finish = None
        if c.finish_reason is not None:
            finish = "tool_calls" if parser.num_tool_calls else c.finish_reason
        if not (parsed or lps or finish or (ctx.req.return_token_ids and c.token_ids)):
            return None
        return ChatStreamChoice(
            index=c.index,
            delta=delta,
            logprobs=lps,
            finish_reason=finish,
            stop_reason=c.stop_reason if finish else None,
            token_ids=list(c.token_ids) if ctx.req.return_token_ids else None,
        )


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _tool_call(call: dict[str, Any]) -> ToolCall:
    fn = call["function"]
    return ToolCall(id=_call_id(), function=FunctionCall(name=fn["name"], arguments=fn["arguments"]))


def _tool_call_deltas(first: int, calls: list[dict[str, Any]]) -> list[ToolCallDelta]:
    """Each call whole in one delta (name and complete arguments), indexed in order of appearance."""
    return [
        ToolCallDelta(
            index=first + k,
            id=_call_id(),
            type="function",
            function=FunctionCall(name=c["function"]["name"], arguments=c["function"]["arguments"]),
        )
        for k, c in enumerate(calls)
    ]
