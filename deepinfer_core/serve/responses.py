"""Response bodies and stream chunks, in OpenAI's shapes (``text_completion``, ``chat.completion``,
``chat.completion.chunk``), plus vLLM's ``token_ids`` / ``prompt_token_ids`` when asked for.

Fields declared with :func:`_opt` are left out while ``None``: a stream delta carries only what it has,
and the extensions appear only when asked for. The rest follow OpenAI, ``null`` included."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


def _opt() -> Any:
    """An optional field that is left out of the JSON while it is None."""
    return Field(None, exclude_if=lambda v: v is None)


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def add(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens = self.prompt_tokens + self.completion_tokens


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = _opt()
    token_ids: list[int] | None = _opt()
    prompt_token_ids: list[int] | None = _opt()


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = _opt()


class FunctionCall(BaseModel):
    name: str | None = _opt()
    arguments: str | None = _opt()


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = _opt()
    type: Literal["function"] | None = _opt()
    function: FunctionCall | None = _opt()


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = _opt()
    tool_calls: list[ToolCall] | None = _opt()


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = _opt()
    token_ids: list[int] | None = _opt()


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = _opt()


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = _opt()
    content: str | None = _opt()
    reasoning_content: str | None = _opt()
    tool_calls: list[ToolCallDelta] | None = _opt()


class ChatStreamChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = _opt()
    token_ids: list[int] | None = _opt()


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = _opt()


def sse(chunk: BaseModel) -> str:
    """One server-sent event carrying ``chunk``."""
    return f"data: {chunk.model_dump_json()}\n\n"


def sse_error(body: dict[str, Any]) -> str:
    import json

    return f"data: {json.dumps(body)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
