"""Requests and sequences: the state the scheduler, KV manager and output processor share.

A :class:`Request` is what the user submitted (one prompt, one :class:`SamplingParams`); it owns
``n`` :class:`Sequence` objects, one per sample. Sample 0 (the *leader*) is created with the request;
samples ``1..n-1`` are created when the leader's prompt is computed, so they can reuse its KV blocks
through the prefix cache instead of recomputing the prompt.

Overlap scheduling (see :mod:`deepinfer_core.engine.overlap`): a token a launched step sampled stays on the
device until the host processes that step, one step later. Until then it is *pending*: counted in
:attr:`Sequence.num_pending`, not yet in ``token_ids``. The scheduler counts it (``num_scheduled_tokens``),
the runner reads its id from the device token buffer, and nothing on the host reads its value.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from deepinfer_core.engine.outputs import PositionLogprobs, RequestMetrics
from deepinfer_core.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    index: int  # arrival number, seeds the generator of unseeded requests
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    siblings_spawned: bool = False
    n: int = 0  # samples; set from params.n
    error: str | None = None  # why the request failed alone (finish_reason "error")
    #: image spans of the prompt (the model's ``ImageSpan``: ``start``, ``end``, ``image``, ``digest``)
    images: list = field(default_factory=list)
    #: span embeddings by image index, each kept from the step that first needs its rows until the step that
    #: schedules the last of them (see :mod:`.images`)
    image_embeds: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.n = self.n or self.params.n

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.n and all(s.status is SeqStatus.FINISHED for s in self.seqs)


_seq_ids = itertools.count()


class Sequence:
    """One sample of a request: its tokens, how many of them are in the KV cache, and its blocks."""

    def __init__(
        self,
        request: Request,
        sample_index: int,
        engine_seed: int,
        max_tokens: int,
        max_model_len: int | None = None,
    ):
        self.seq_id = next(_seq_ids)
        self.request = request
        self.params = request.params
        self.sample_index = sample_index
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.max_tokens = max_tokens
        #: the length at which it ends with ``"length"`` (``max_tokens`` outputs or ``max_model_len``)
        self.length_limit = self.num_prompt_tokens + max_tokens
        if max_model_len is not None:
            self.length_limit = min(self.length_limit, max_model_len)
        #: tokens sampled by launched steps whose values the host has not learned yet (overlap scheduling)
        self.num_pending = 0
        #: bumped by the KV manager whenever ``block_tables`` change (the persistent batch rewrites the row)
        self.tables_version = 0
        self.num_computed = 0  # tokens whose state is in the KV pools
        #: tokens taken from the prefix cache when last (re)admitted: state of bounded-replay layers before
        #: them was never written for this request (see :mod:`.layer_range`)
        self.resumed_at = 0
        self.status = SeqStatus.WAITING
        #: group name -> physical block ids, ``-1`` where a window block was released
        self.block_tables: dict[str, list[int]] = {}
        #: chain hashes of the leading full blocks of ``token_ids`` (prefix-cache keys, computed lazily)
        self.block_hashes: list[int] = []
        self.num_committed_blocks = 0  # leading full blocks already offered to the prefix cache
        self.image_keys = tuple((s.start, s.end, s.digest) for s in request.images)
        self.logprobs: list[PositionLogprobs] | None = [] if request.params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.text_pieces: list[str] = []  # detokenized output, joined on demand
        self.num_text_tokens = 0  # leading output tokens that make up the text (not EOS / stop token)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        seed = (
            request.params.seed
            if request.params.seed is not None
            else engine_seed * 1_000_003 + request.index
        )
        self.sampling_seed = (seed * 7919 + sample_index) & 0x7FFF_FFFF_FFFF_FFFF
        self.grammar_key: str | None = None  # its key in the StructuredOutputManager when constrained
        #: draft tokens to verify in the next step (speculative decoding); never part of ``token_ids``
        self.spec_token_ids: list[int] = []
        #: ``[len(spec_token_ids), V]``: the distribution each draft was sampled from; None: one-hot drafts
        self.spec_token_probs: torch.Tensor | None = None
        #: draws a proposer has taken for this sample (the position of its next draft draw; see draft_seed)
        self.num_draft_draws = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens known to the host plus the pending ones: what the scheduler counts."""
        return len(self.token_ids) + self.num_pending

    @property
    def num_sampled_outputs(self) -> int:
        """Output tokens sampled so far, pending ones included (``min_tokens`` counts these)."""
        return len(self.token_ids) + self.num_pending - self.num_prompt_tokens

    @property
    def ends_with_pending(self) -> bool:
        """Its pending tokens reach its length limit: it finishes when the host learns them, so it is not
        scheduled again (nothing could be computed past ``max_model_len``)."""
        return self.num_pending > 0 and len(self.token_ids) + self.num_pending >= self.length_limit

    @property
    def text(self) -> str:
        return "".join(self.text_pieces)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_computed < self.num_prompt_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and self.sample_index == 0

    def set_drafts(self, token_ids: list[int], probs: torch.Tensor | None = None) -> None:
        self.spec_token_ids, self.spec_token_probs = token_ids, probs

    @property
    def draft_seed(self) -> int:
        """The seed a proposer draws this sample's drafts with (keyed at ``num_draft_draws``): derived from the
        sampling seed, so a seeded request drafts the same tokens every run, but not equal to it, so the
        verifier's draws (keyed at the sampling seed) are independent of the drafts, as lossless rejection
        sampling needs."""
        return self.sampling_seed ^ 0x5DEECE66D

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.request.request_id}, sample={self.sample_index}, "
            f"tokens={self.num_tokens}, computed={self.num_computed}, {self.status.value})"
        )
