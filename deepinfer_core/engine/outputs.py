"""What ``LLM.generate`` returns (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: one position's logprobs: token id -> Logprob (top-k plus the actual token)
PositionLogprobs = dict[int, "Logprob"]


@dataclass
class Logprob:
    logprob: float  # log-softmax of the model's raw logits
    rank: int  # 1 + number of tokens with a strictly higher logprob
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    #: "stop", "length", "abort", or "error" (this request failed alone; see ``RequestOutput.error``)
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock figures of one request, in seconds (``time.perf_counter`` based)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    #: seconds from arrival to the first generated token (time to first token)
    first_token_time: float | None = None
    #: mean seconds per generated token after the first
    time_per_output_token: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return self.first_token_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = field(default=None, repr=False)
    #: why the request failed (its unfinished samples end with ``finish_reason="error"``); None if it did not
    error: str | None = None
