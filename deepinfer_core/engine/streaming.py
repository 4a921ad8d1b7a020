"""Incremental outputs of running requests, for streaming fronts such as :class:`AsyncLLM`.

``LLMEngine.step`` returns a :class:`RequestOutput` only when a request finishes. A streaming front
also needs what each running sample added in a step. Two pieces provide it without touching the step
loop:

- :class:`ProgressTracker` (engine thread only) reads a request's samples after a step and returns the
  output tokens and logprobs each one gained since the last call. Tokens are never taken back
  (preemption keeps sampled tokens, speculative tokens join ``token_ids`` only once verified), so the
  new tokens are a suffix of the output.
- :class:`TextDeltas` (any thread) turns those tokens into text pieces whose concatenation equals the
  final ``CompletionOutput.text``: pieces come from the same incremental detokenizer the output
  processor uses, and with stop strings the last ``max(len(stop)) - 1`` characters are held back, since
  a stop string found later may start inside them and be cut. The rest of the text is taken from the
  final output, so EOS, stop tokens and cut stop strings never reach a client.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from deepinfer_core.engine.detokenizer import make_detokenizer
from deepinfer_core.engine.outputs import PositionLogprobs
from deepinfer_core.engine.sequence import Request
from deepinfer_core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class SampleProgress:
    """What one sample gained in a step."""

    index: int
    token_ids: list[int]  # new output tokens (may end with EOS or a stop token once finished)
    logprobs: list[PositionLogprobs] | None
    finished: bool  # the sample has a finish reason; its text comes with the request's final output


class ProgressTracker:
    """Reports, per call, the tokens every sample of one request gained since the previous call.

    Only the thread that steps the engine may call :meth:`poll`: it reads the live sequences."""

    def __init__(self, request: Request):
        self.request = request
        self._sent: dict[int, int] = {}  # sample index -> output tokens already reported
        self._prompt_logprobs_sent = request.params.prompt_logprobs is None

    @property
    def scheduled(self) -> bool:
        """Whether the request has been scheduled at least once (it left the waiting queue)."""
        return self.request.metrics.first_scheduled_time is not None

    def take_prompt_logprobs(self) -> list[PositionLogprobs | None] | None:
        """The prompt's logprobs, once, when all of them are known (they are before the first token)."""
        plp = self.request.prompt_logprobs
        if self._prompt_logprobs_sent or plp is None or len(plp) < len(self.request.prompt_token_ids):
            return None
        self._prompt_logprobs_sent = True
        return list(plp)

    def poll(self) -> list[SampleProgress]:
        out = []
        for seq in self.request.seqs:
            sent = self._sent.get(seq.sample_index, 0)
            total = seq.num_output_tokens
            if total <= sent:
                continue
            start = seq.num_prompt_tokens + sent
            lps = seq.logprobs[sent:total] if seq.logprobs is not None else None
            out.append(
                SampleProgress(seq.sample_index, seq.token_ids[start:], lps, seq.finish_reason is not None)
            )
            self._sent[seq.sample_index] = total
        return out


class TextDeltas:
    """Text of one sample, piece by piece; ``"".join(pieces) == CompletionOutput.text``."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams):
        self._tokenizer = tokenizer
        self._prompt = prompt_token_ids
        self._skip = params.skip_special_tokens
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self._detok: Any = None
        self._pending = ""  # decoded, not handed out yet (at least the held-back tail)
        self._sent: list[str] = []

    def add(self, token_ids: list[int]) -> str:
        """Text of tokens of a sample that has not finished (every such token is text)."""
        if self._tokenizer is None or not token_ids:
            return ""
        if self._detok is None:
            self._detok = make_detokenizer(self._tokenizer, self._prompt, self._skip)
        self._pending += "".join(self._detok.add(t) for t in token_ids)
        ready = len(self._pending) - self._hold
        if ready <= 0:
            return ""
        out, self._pending = self._pending[:ready], self._pending[ready:]
        self._sent.append(out)
        return out

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the sample's text in the request's final output)."""
        sent = "".join(self._sent)
        if not final_text.startswith(sent):
            logger.warning("streamed text is not a prefix of the final text; sending the final tail only")
        self._sent = [final_text]
        return final_text[len(sent) :]
