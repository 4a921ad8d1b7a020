"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions`` (OpenAI's fields and names).

Like vLLM, both also accept the engine's other sampling fields (:class:`SamplingFields`), and a field
that is neither is refused (``extra="forbid"``), so a typo gets a 400 that names it instead of being
ignored. Range checks are the engine's (``SamplingParams``), so the server and ``LLM.generate`` accept
exactly the same values.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchema(_Body):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class SamplingFields(_Body):
    """Fields both endpoints share: OpenAI's, then the engine's extras (vLLM's names)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # the engine's sampling fields beyond OpenAI's
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    prompt_logprobs: int | None = None
    structured_outputs: dict[str, Any] | None = None
    #: add each choice's generated token ids (and the prompt's) to the response, as vLLM does
    return_token_ids: bool = False


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True


class ChatCompletionRequest(SamplingFields):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | int | None = None  # V4.1 also takes its 1-100 budget
    chat_template_kwargs: dict[str, Any] | None = None
