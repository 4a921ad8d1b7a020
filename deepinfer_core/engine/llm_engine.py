"""The engine: requests in, one step at a time, ``RequestOutput``s out.

``step()`` is the whole loop: schedule -> execute -> sample -> update -> outputs. With
``async_scheduling`` the loop overlaps (:mod:`deepinfer_core.engine.overlap`): it launches step N+1
before it processes step N's tokens, unless a live sequence needs its last token on the host first
(structured output, penalties, speculative decoding): then the step in flight lands and the step runs
synchronously.

One request never takes the others down. Whatever fails for one request (its grammar allows no token,
its grammar library raises, its output processing raises, or the step raises and the same request fails
again when stepped alone) ends that request with ``finish_reason="error"`` and ``RequestOutput.error``;
its blocks and grammar state are freed and every other request goes on. The engine is not thread-safe:
:class:`~deepinfer_core.engine.llm.LLM` serialises its callers.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from deepinfer_core.config import ConfigError, EngineConfig
from deepinfer_core.engine.draft_rounds import draft_round, verified_rows
from deepinfer_core.engine.input_processor import InputProcessor, ProcessedPrompt
from deepinfer_core.engine.layer_range import bounded_replay
from deepinfer_core.engine.loader import model_bytes
from deepinfer_core.engine.model_runner import ModelRunner
from deepinfer_core.engine.output_processor import OutputProcessor
from deepinfer_core.engine.outputs import RequestMetrics, RequestOutput
from deepinfer_core.engine.overlap import OverlapLoop
from deepinfer_core.engine.proposer_context import EngineProposerContext
from deepinfer_core.engine.sampler import Sampler
from deepinfer_core.engine.scheduler import Scheduler, SchedulerOutput
from deepinfer_core.engine.sequence import Request, SeqStatus, Sequence
from deepinfer_core.kv.budget import choose_block_size, plan_kv
from deepinfer_core.kv.kv_manager import KVCacheManager
from deepinfer_core.kv.spec import check_specs
from deepinfer_core.models.base import CausalLM
from deepinfer_core.ops.backends import Backends
from deepinfer_core.spec_decode import SpecStats, build_proposer
from deepinfer_core.structured import StructuredOutputManager, check_backend_name

log = logging.getLogger("deepinfer.engine")
Failures = list[tuple[Sequence, str]]


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model: CausalLM,
        backends: Backends,
        tokenizer: Any = None,
        structured_backends: Mapping[str, Any] | None = None,
        proposers: Mapping[str, Any] | None = None,
    ):
        self.config, self.model, self.backends, self.tokenizer = config, model, backends, tokenizer
        check_backend_name(structured_backends or {}, config.structured_outputs_backend)
        self.max_model_len = _max_model_len(config, model)
        self.proposer = build_proposer(config.speculative_config, proposers or {}, model, config)
        self.spec_stats = SpecStats()
        #: speculative_config.disable_by_batch_size: no drafts while more sequences run (validated above)
        self.spec_disable_above = (config.speculative_config or {}).get("disable_by_batch_size")
        specs = model.cache_specs()
        check_specs(specs, model.num_layers)
        taps_hidden = self.proposer is not None and self.proposer.needs_hidden
        replay = bounded_replay(model, specs, config.swa_bounded_replay, taps_hidden)
        block_size = choose_block_size(specs, config.block_size)
        budget = config.kv_cache_memory_bytes
        if budget is None:
            budget = backends.memory.available_kv_bytes(config.gpu_memory_utilization, model_bytes(model))
        self.kv_layout = plan_kv(
            specs, block_size, budget, self.max_model_len, config.max_num_seqs, config.max_num_batched_tokens
        )
        replayed, replay_tokens = (replay.groups, replay.window) if replay else ((), 0)
        self.kv = KVCacheManager(
            specs,
            block_size,
            self.kv_layout.num_blocks,
            config.enable_prefix_caching,
            replayed,
            replay_tokens,
        )
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        graph_bs = 0 if config.enforce_eager else min(config.max_cudagraph_capture_size, config.max_num_seqs)
        self.runner = ModelRunner(model, backends, self.kv_layout, self.max_model_len, graph_bs)
        self.runner.bounded_replay = replay
        self.runner.max_encoder_patches = config.max_encoder_patches
        self.runner.device_plan = config.device_plan and model.device_plan
        self.structured = StructuredOutputManager(
            structured_backends or {},
            config.structured_outputs_backend,
            tokenizer,
            model.vocab_size,
            model.eos_token_ids,
            max_spec_bytes=config.structured_outputs_max_spec_bytes,
            compile_timeout_s=config.structured_outputs_compile_timeout_s,
        )
        self.sampler = Sampler(
            backends.sampling, model.eos_token_ids, model.vocab_size, self.structured, self.spec_stats
        )
        self.sampler.host_buffer = lambda n: backends.memory.pinned_host_buffer((n,), torch.int64)
        self.inputs = InputProcessor(
            tokenizer, model.vocab_size, self.max_model_len, self.structured, config.max_n,
            model.prepare_images, config.max_encoder_patches,
        )  # fmt: skip
        self.outputs = OutputProcessor(tokenizer, model.eos_token_ids, self.max_model_len, self.structured)
        self.requests: dict[str, Request] = {}
        self._arrivals = itertools.count()
        self._pending_aborts: set[str] = set()
        self._lock = threading.Lock()
        self.num_prompt_tokens = self.num_generation_tokens = self.num_requests = 0
        #: retry a failed step one sequence at a time (off where ranks must run the same steps: EP)
        self.isolate_failures = True
        #: overlap scheduling (config, else the platform's default; off where ranks vote on each step: DP)
        self.async_scheduling = (
            backends.memory.overlaps_host if config.async_scheduling is None else config.async_scheduling
        )
        self.overlap = OverlapLoop(self)
        #: live sequences whose next step needs their last token on the host (grammar, penalties)
        self._host_bound: set[Sequence] = set()
        if self.proposer is not None:
            self.runner.tap_hidden = self.proposer.needs_hidden
            self.proposer.bind(EngineProposerContext(self.runner, self.kv))

    @classmethod
    def from_config(cls, config: EngineConfig, runtime: Any = None) -> LLMEngine:
        from deepinfer_core.engine.loader import load
        from deepinfer_core.runtime import build_runtime

        rt = runtime if runtime is not None else build_runtime(config)
        # a grammar backend that is not installed fails before the weights load
        check_backend_name(rt.registry.structured_backends, config.structured_outputs_backend)
        model, tokenizer = load(config, rt)
        return cls(
            config,
            model,
            rt.backends,
            tokenizer,
            rt.registry.structured_backends,
            rt.registry.proposers,
        )

    # ------------------------------------------------------------------ requests

    def add_request(self, item: ProcessedPrompt, request_id: str | None = None) -> str:
        """Queue a validated prompt (see :meth:`InputProcessor.process`); returns its request id."""
        index = next(self._arrivals)
        rid = request_id if request_id is not None else str(index)
        if rid in self.requests:
            raise ValueError(f"request_id={rid!r} is invalid: a request with this id is still running")
        req = Request(
            rid, index, item.prompt, item.token_ids, item.params, RequestMetrics(time.perf_counter()),
            images=item.images,
        )  # fmt: skip
        if item.params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        if item.error is not None:  # it fails alone, when the next step starts
            req.error = f"request {rid!r} failed: {item.error}"
            with self._lock:
                self._pending_aborts.add(rid)
        self._new_seq(req, 0, front=False)
        self.requests[rid] = req
        self.num_requests += 1
        self.num_prompt_tokens += len(item.token_ids)
        return rid

    def add_requests(self, items: list[ProcessedPrompt], request_ids: list[str] | None = None) -> list[str]:
        """Queue all of ``items`` or none: if one cannot be queued, those queued before it are removed."""
        added: list[str] = []
        try:
            for i, item in enumerate(items):
                added.append(self.add_request(item, None if request_ids is None else request_ids[i]))
        except BaseException:
            for rid in added:
                req = self.requests.pop(rid)
                self._end(req, "abort")
                self.num_requests -= 1
                self.num_prompt_tokens -= len(req.prompt_token_ids)
            raise
        return added

    def _new_seq(self, req: Request, index: int, front: bool) -> None:
        max_tokens = req.params.max_tokens or self.max_model_len - len(req.prompt_token_ids)
        seq = Sequence(req, index, self.config.seed, max_tokens, self.max_model_len)
        if req.params.structured_outputs is not None or req.params.has_penalties:
            self._host_bound.add(seq)
        if req.params.structured_outputs is not None:
            seq.grammar_key = f"{req.request_id}/{index}"
            self.structured.validate_and_compile(
                seq.grammar_key, req.params.structured_outputs, req.prompt_token_ids
            )
        req.seqs.append(seq)
        self.scheduler.add(seq, front=front)

    def abort(self, request_id: str) -> None:
        """Abort a request; takes effect before the next step (safe to call from another thread). Its
        output, with ``finish_reason="abort"``, is returned by that step."""
        with self._lock:
            self._pending_aborts.add(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self._pending_aborts)

    # ------------------------------------------------------------------ the step loop

    def step(self) -> list[RequestOutput]:
        if self.async_scheduling and self._may_overlap():
            return self.overlap.step()
        return self.overlap.land() + self._sync_step()

    def _may_overlap(self) -> bool:
        """No live sequence needs its last token on the host before its next step can run."""
        if self.proposer is not None:
            return False
        if self._host_bound:
            self._host_bound = {s for s in self._host_bound if s.status is not SeqStatus.FINISHED}
        return not self._host_bound

    def _sync_step(self) -> list[RequestOutput]:
        aborted = self.apply_aborts()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return aborted + self._stuck()
        finished, failed, retried = self._run(sched)
        errors = self._fail(failed) + self._post_step(sched)
        if self.proposer is not None and not retried:  # (after a step retried alone, no drafts this round)
            drafted = draft_round(
                self.proposer, sched, self.runner.last_rows, self.scheduler.running, self.max_model_len,
                self.spec_disable_above,
            )  # fmt: skip
            self.spec_stats.num_disabled_rounds += not drafted
        return aborted + errors + self._collect(finished)

    def _compute(self, sched: SchedulerOutput) -> tuple[list[Sequence], Failures]:
        logits = self.runner.execute(sched)
        samples = self.sampler.sample(logits, sched)
        finished, failed = self.outputs.append(sched, samples)
        self.scheduler.update(sched, finished)
        return finished, failed

    def _run(self, sched: SchedulerOutput) -> tuple[list[Sequence], Failures, bool]:
        """The step; if it raises, each sequence is stepped alone, and those that raise again fail. The
        failed attempt left nothing behind: KV is written by position and rewritten by the retry, and
        sequence state only changes after sampling, whose per-sequence errors are caught where they occur.
        The proposer sees each retried sequence's step (its draft windows stay complete). The last value says
        whether the step was retried so."""
        try:
            return (*self._compute(sched), False)
        except Exception as exc:  # noqa: BLE001 - find the request(s) that break the step
            if not self.isolate_failures:
                raise
            log.warning(
                "deepinfer: a step of %d sequences raised %r; retrying each alone", len(sched.scheduled), exc
            )
        finished: list[Sequence] = []
        failed: Failures = []
        for s in sched.scheduled:
            try:
                alone = SchedulerOutput([s])
                done, bad = self._compute(alone)
                if self.proposer is not None:  # its windows must not miss these positions
                    self.proposer.observe(verified_rows(alone, self.runner.last_rows))
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                done, bad = [], [(s.seq, f"its step raised {type(exc).__name__}: {exc}")]
            finished += done
            failed += bad
        return finished, failed, True

    def _fail(self, failed: Failures) -> list[RequestOutput]:
        """End each failed sequence's request with ``finish_reason="error"``; returns their outputs."""
        outs = []
        for seq, why in failed:
            req = seq.request
            if self.requests.pop(req.request_id, None) is None:
                continue  # a sibling sample already failed it
            req.error = f"request {req.request_id!r} failed: {why}"
            log.warning("deepinfer: %s", req.error)
            self._end(req, "error")
            outs.append(self.outputs.request_output(req))
        return outs

    def _end(self, req: Request, reason: str) -> None:
        """Stop every live sample of ``req`` with ``reason``, freeing their blocks and grammar state."""
        live = [s for s in req.seqs if s.status is not SeqStatus.FINISHED]
        self.scheduler.abort(live)
        for s in live:
            s.finish_reason = s.finish_reason if reason != "error" and s.finish_reason else reason
            self.outputs.forget(s)
        req.n = len(req.seqs)  # samples not yet spawned will not come
        req.siblings_spawned = True

    def _post_step(self, sched: SchedulerOutput) -> list[RequestOutput]:
        """Count generated tokens; start samples 1..n-1 once sample 0's prompt is computed, so they find
        it in the prefix cache. Returns the outputs of requests whose samples could not start."""
        errors = []
        for s in sched.scheduled:
            req = s.seq.request
            if s.samples and s.seq.finish_reason != "error":  # one token, or accepted drafts + one
                self.num_generation_tokens += len(s.seq.token_ids) - s.end + s.num_drafts
            if s.samples and s.seq.sample_index == 0 and req.n > 1 and not req.siblings_spawned:
                req.siblings_spawned = True
                try:
                    for i in range(req.n - 1, 0, -1):
                        self._new_seq(req, i, front=True)
                except Exception as exc:  # noqa: BLE001 - e.g. its grammar cannot start again
                    errors += self._fail(
                        [(s.seq, f"starting its samples raised {type(exc).__name__}: {exc}")]
                    )
                req.seqs.sort(key=lambda q: q.sample_index)
        return errors

    def _collect(self, finished: list[Sequence]) -> list[RequestOutput]:
        outs = []
        for seq in finished:
            req = seq.request
            if req.finished and self.requests.pop(req.request_id, None) is not None:
                outs.append(self.outputs.request_output(req))
        return outs

    def apply_aborts(self) -> list[RequestOutput]:
        """Carry out pending aborts now; returns the aborted requests' outputs (and those of the step in
        flight, which lands first, so an abort sees the same tokens as without overlap). A request queued
        with an input error (a bad image) ends here too, with ``finish_reason="error"``."""
        with self._lock:
            ids, self._pending_aborts = self._pending_aborts, set()
        outs = self.overlap.land() if ids else []
        for rid in ids:
            req = self.requests.pop(rid, None)
            if req is not None:
                self._end(req, "abort" if req.error is None else "error")
                outs.append(self.outputs.request_output(req))
        return outs

    def _stuck(self) -> list[RequestOutput]:
        if self.requests:
            raise RuntimeError(
                f"scheduler made no progress with {len(self.scheduler.waiting)} waiting and "
                f"{len(self.scheduler.running)} running sequences (KV pools: "
                + ", ".join(f"{g}: {p.num_available}/{p.num_blocks} free" for g, p in self.kv.pools.items())
                + ")"
            )
        return []

    def get_stats(self) -> dict[str, Any]:
        return {
            "num_requests": self.num_requests,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_generation_tokens": self.num_generation_tokens,
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_queries": self.kv.stats.queries,
            "prefix_cache_hits": self.kv.stats.hits,
            "host_tier_bytes": int(getattr(self.model, "host_tier_bytes", 0)),
            **self.spec_stats.as_dict(),
        }


def _max_model_len(config: EngineConfig, model: CausalLM) -> int:
    limit = model.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ConfigError(
            f"max_model_len={config.max_model_len} is invalid: the model supports at most {limit} positions"
        )
    return config.max_model_len
