"""Request body -> :class:`SamplingParams`: OpenAI's names and defaults mapped onto the engine's.

OpenAI defaults kept: ``temperature=1``, ``top_p=1``, ``n=1``; ``max_tokens`` 16 for completions and
"until the end" for chat, capped at the server's ``max_tokens_limit``. ``response_format`` becomes a
structured-output constraint (``json_object`` / ``json_schema``); the engine's own
``structured_outputs`` field is accepted too, but not both.
"""

from __future__ import annotations

from typing import Any

from deepinfer_core.sampling_params import SamplingParams, StructuredOutputsParams
from deepinfer_core.serve.errors import bad_request, from_value_error
from deepinfer_core.serve.protocol import ResponseFormat, SamplingFields
from deepinfer_core.serve.settings import ServeSettings

#: request fields passed to SamplingParams unchanged when given
_PASSTHROUGH = (
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "prompt_logprobs",
)


def sampling_params(
    req: SamplingFields,
    settings: ServeSettings,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    skip_special_tokens: bool,
) -> SamplingParams:
    """Validated engine parameters for ``req``; every problem is a 400 naming its field."""
    if max_tokens is not None and max_tokens > settings.max_tokens_limit:
        raise bad_request(
            f"max_tokens={max_tokens} is invalid: must be <= {settings.max_tokens_limit} (this server's limit)",
            "max_tokens",
        )
    kwargs: dict[str, Any] = {k: getattr(req, k) for k in _PASSTHROUGH if getattr(req, k) is not None}
    kwargs.update(
        n=req.n,
        temperature=1.0 if req.temperature is None else req.temperature,
        max_tokens=max_tokens,
        logprobs=logprobs,
        stop=req.stop or [],
        skip_special_tokens=skip_special_tokens
        if req.skip_special_tokens is None
        else req.skip_special_tokens,
    )
    if req.logit_bias:
        kwargs["logit_bias"] = dict(req.logit_bias)
    structured = _structured(req, settings)
    if structured is not None:
        kwargs["structured_outputs"] = structured
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:
        raise from_value_error(e) from None


def _structured(req: SamplingFields, settings: ServeSettings) -> StructuredOutputsParams | None:
    fmt = req.response_format
    if fmt is not None and fmt.type != "text" and req.structured_outputs is not None:
        raise bad_request("give response_format or structured_outputs, not both", "structured_outputs")
    if req.structured_outputs is not None:
        try:
            return StructuredOutputsParams(**req.structured_outputs)
        except ValueError as e:
            raise bad_request(str(e), "structured_outputs") from None
    if fmt is None or fmt.type == "text":
        return None
    return _response_format(fmt, settings.disable_any_whitespace)


def _response_format(fmt: ResponseFormat, compact: bool) -> StructuredOutputsParams:
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True, disable_any_whitespace=compact)
    if fmt.json_schema is None:
        raise bad_request(
            "response_format.json_schema is required when type is 'json_schema'",
            "response_format.json_schema",
        )
    return StructuredOutputsParams(json=fmt.json_schema.schema_, disable_any_whitespace=compact)


def renames(req: SamplingFields, base: dict[str, str]) -> dict[str, str]:
    """The engine's parameter names -> this request's (a constraint came from ``response_format``)."""
    if req.response_format is not None and req.response_format.type != "text":
        return {**base, "structured_outputs": "response_format"}
    return base
