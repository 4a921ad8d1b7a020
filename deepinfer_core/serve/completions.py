"""``POST /v1/completions``: prompts as text or token ids, one choice per (prompt, sample).

Choice ``i * n + j`` is sample ``j`` of prompt ``i``. ``echo`` puts the prompt before the completion
(with its logprobs when ``logprobs`` is set); a streamed choice gets its echo in its first chunk.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from deepinfer_core.engine.async_llm import CompletionDelta, RequestDelta
from deepinfer_core.engine.outputs import CompletionOutput, RequestOutput
from deepinfer_core.serve.errors import ApiError, bad_request
from deepinfer_core.serve.logprobs import CompletionLogprobsBuilder, merge
from deepinfer_core.serve.protocol import CompletionRequest
from deepinfer_core.serve.responses import (
    SSE_DONE,
    CompletionChoice,
    CompletionResponse,
    Usage,
    sse,
    sse_error,
)
from deepinfer_core.serve.sampling import renames, sampling_params
from deepinfer_core.serve.serving import Serving, Submission, stream_error

_RENAMES = {"prompts": "prompt", "sampling_params": "prompt"}


class CompletionsServing(Serving):
    async def submit_body(self, body: Any) -> Submission:
        start = time.perf_counter()
        req = self.parse(CompletionRequest, body)
        prompts = _prompts(req.prompt)
        if req.suffix is not None:
            raise bad_request("suffix is not supported", "suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request(f"best_of={req.best_of} is invalid: only best_of == n is supported", "best_of")
        params = [self._params(req) for _ in prompts]
        items = await self.process(prompts, params, req.add_special_tokens, renames(req, _RENAMES))
        return self.submit("cmpl", req, items, start)

    def _params(self, req: CompletionRequest):
        p = sampling_params(
            req,
            self.settings,
            max_tokens=16 if req.max_tokens is None else req.max_tokens,
            logprobs=req.logprobs,
            skip_special_tokens=True,
        )
        if req.echo and req.logprobs is not None and p.prompt_logprobs is None:
            p.prompt_logprobs = req.logprobs
        return p

    async def response(self, sub: Submission) -> dict[str, Any]:
        outs = await self.finals(sub)
        req: CompletionRequest = sub.body
        choices, usage = [], Usage()
        for i, out in enumerate(outs):
            usage.add(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))
            for c in out.outputs:
                choices.append(self._choice(req, i * req.n + c.index, out, c))
        resp = CompletionResponse(
            id=sub.id, created=sub.created, model=sub.model, choices=choices, usage=usage
        )
        return resp.model_dump(mode="json")

    def _choice(
        self, req: CompletionRequest, index: int, out: RequestOutput, c: CompletionOutput
    ) -> CompletionChoice:
        text, logprobs = c.text, None
        echo = self._prompt_text(out) if req.echo else ""
        if req.logprobs is not None:
            b = CompletionLogprobsBuilder()
            parts = [b.prompt(out.prompt_token_ids, out.prompt_logprobs)] if req.echo else []
            logprobs = merge([*parts, b.add(c.token_ids, c.logprobs or [])])
        return CompletionChoice(
            index=index,
            text=echo + text,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
            token_ids=list(c.token_ids) if req.return_token_ids else None,
            prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
        )

    def _prompt_text(self, out: RequestOutput) -> str:
        if out.prompt is not None:
            return out.prompt
        tok = self.llm.tokenizer
        return tok.decode(out.prompt_token_ids, skip_special_tokens=False) if tok is not None else ""

    async def stream(self, sub: Submission) -> AsyncIterator[str]:
        req: CompletionRequest = sub.body
        state = _StreamState(req)
        try:
            async for i, d in self.deltas(sub):
                if d.finished:
                    state.usage.add(
                        len(d.output.prompt_token_ids), sum(len(c.token_ids) for c in d.output.outputs)
                    )
                choices = [self._chunk_choice(state, sub, i, d, c) for c in d.outputs]
                choices = [c for c in choices if c is not None]
                if choices:
                    yield sse(
                        CompletionResponse(id=sub.id, created=sub.created, model=sub.model, choices=choices)
                    )
        except (ApiError, RuntimeError) as e:
            sub.abort()
            yield sse_error(stream_error(e))
            yield SSE_DONE
            return
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse(
                CompletionResponse(
                    id=sub.id, created=sub.created, model=sub.model, choices=[], usage=state.usage
                )
            )
        yield SSE_DONE

    def _chunk_choice(
        self, state: _StreamState, sub: Submission, i: int, d: RequestDelta, c: CompletionDelta
    ) -> CompletionChoice | None:
        req = state.req
        index = i * req.n + c.index
        if d.prompt_logprobs is not None:
            state.prompt_logprobs[i] = d.prompt_logprobs
        text, parts = c.text, []
        b = state.builders.setdefault(index, CompletionLogprobsBuilder())
        if req.echo and index not in state.echoed:
            state.echoed.add(index)
            stream = sub.streams[i]
            text = (stream.prompt or self._decode(stream.prompt_token_ids)) + text
            if req.logprobs is not None:
                parts.append(b.prompt(stream.prompt_token_ids, state.prompt_logprobs.get(i)))
        if req.logprobs is not None and c.logprobs:
            parts.append(b.add(c.token_ids, c.logprobs))
        if not (text or c.finish_reason or parts or (req.return_token_ids and c.token_ids)):
            return None
        return CompletionChoice(
            index=index,
            text=text,
            logprobs=merge(parts) if parts else None,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
            token_ids=list(c.token_ids) if req.return_token_ids else None,
        )

    def _decode(self, ids: list[int]) -> str:
        tok = self.llm.tokenizer
        return tok.decode(ids, skip_special_tokens=False) if tok is not None else ""


class _StreamState:
    def __init__(self, req: CompletionRequest):
        self.req = req
        self.usage = Usage()
        self.echoed: set[int] = set()
        self.builders: dict[int, CompletionLogprobsBuilder] = {}
        self.prompt_logprobs: dict[int, Any] = {}


def _prompts(prompt: Any) -> list[Any]:
    """OpenAI's four prompt forms -> the engine's prompt list."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [{"prompt_token_ids": list(prompt)}]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [{"prompt_token_ids": list(p)} for p in prompt]
