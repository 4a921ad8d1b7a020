"""Prometheus metrics (``GET /metrics``), in a registry of the server's own.

Two sources. Per request, the handlers time what the client sees (a :class:`RequestTimer` per engine
request): requests by outcome, prompt and generated tokens, time to first token, time per output token
and end-to-end latency. Engine state (running and waiting requests, KV usage, prefix-cache hits,
speculative acceptance, preemptions) is read at scrape time from the snapshot the step thread
publishes (:meth:`AsyncLLM.stats`), so a scrape never touches the engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deepinfer_core.engine.async_llm import AsyncLLM, RequestDelta

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ServerMetrics:
    def __init__(self, llm: AsyncLLM):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "deepinfer_requests",
            "Requests by outcome: a finish reason, or why they were refused",
            ["outcome"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "deepinfer_prompt_tokens", "Prompt tokens of requests served", registry=r
        )
        self.generation_tokens = Counter("deepinfer_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "deepinfer_time_to_first_token_seconds",
            "From request arrival to its first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "deepinfer_time_per_output_token_seconds",
            "Mean time per generated token after the first, per request",
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "deepinfer_e2e_request_latency_seconds",
            "From request arrival to its last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_EngineCollector(llm))

    def refused(self, outcome: str) -> None:
        """A request the server answered without generating (``bad_request``, ``queue_full``, ...)."""
        self.requests.labels(outcome).inc()

    def timer(self, start: float | None = None) -> RequestTimer:
        return RequestTimer(self, start)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Times one engine request from its arrival at the server, as its client sees it."""

    def __init__(self, metrics: ServerMetrics, start: float | None = None):
        self.metrics = metrics
        self.start = time.perf_counter() if start is None else start
        self.first: float | None = None
        self.tokens = 0
        self.done = False

    def observe(self, delta: RequestDelta) -> None:
        n = sum(len(c.token_ids) for c in delta.outputs)
        if n and self.first is None:
            self.first = time.perf_counter()
            self.metrics.ttft.observe(self.first - self.start)
        self.tokens += n
        if delta.finished and delta.output is not None:
            reasons = {c.finish_reason for c in delta.output.outputs}
            outcome = next((r for r in ("error", "abort", "length") if r in reasons), "stop")
            self.finish(outcome, len(delta.output.prompt_token_ids))

    def finish(self, outcome: str, prompt_tokens: int = 0) -> None:
        if self.done:
            return
        self.done = True
        m, now = self.metrics, time.perf_counter()
        m.requests.labels(outcome).inc()
        m.prompt_tokens.inc(prompt_tokens)
        m.generation_tokens.inc(self.tokens)
        m.e2e.observe(now - self.start)
        if self.first is not None and self.tokens > 1:
            m.tpot.observe((now - self.first) / (self.tokens - 1))


class _EngineCollector(Collector):
    def __init__(self, llm: AsyncLLM):
        self.llm = llm

    def collect(self) -> Iterator[Metric]:
        s = self.llm.stats()
        c = s.counters
        yield GaugeMetricFamily(
            "deepinfer_num_requests_running", "Requests being generated", value=s.num_running
        )
        yield GaugeMetricFamily(
            "deepinfer_num_requests_waiting", "Requests waiting to be scheduled", value=s.num_waiting
        )
        kv = GaugeMetricFamily(
            "deepinfer_kv_cache_usage_ratio", "Fraction of KV blocks in use", labels=["group"]
        )
        for group, used in s.kv_blocks_in_use.items():
            kv.add_metric([group], used / max(1, s.kv_blocks_total[group]))
        yield kv
        queries, hits = c.get("prefix_cache_queries", 0), c.get("prefix_cache_hits", 0)
        yield CounterMetricFamily(
            "deepinfer_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", value=queries
        )
        yield CounterMetricFamily(
            "deepinfer_prefix_cache_hits", "Prompt tokens found in the prefix cache", value=hits
        )
        yield GaugeMetricFamily(
            "deepinfer_prefix_cache_hit_rate",
            "Prefix-cache hits / queries since start",
            value=hits / max(1, queries),
        )
        yield from _spec_metrics(c)
        yield CounterMetricFamily(
            "deepinfer_num_preemptions", "Sequences preempted for KV space", value=c.get("num_preemptions", 0)
        )


def _spec_metrics(c: dict) -> Iterator[Metric]:
    drafts, accepted = c.get("spec_num_draft_tokens", 0), c.get("spec_num_accepted_tokens", 0)
    yield CounterMetricFamily("deepinfer_spec_decode_draft_tokens", "Draft tokens proposed", value=drafts)
    yield CounterMetricFamily(
        "deepinfer_spec_decode_accepted_tokens", "Draft tokens accepted", value=accepted
    )
    yield GaugeMetricFamily(
        "deepinfer_spec_decode_acceptance_rate",
        "Accepted / proposed draft tokens",
        value=accepted / max(1, drafts),
    )
    yield GaugeMetricFamily(
        "deepinfer_spec_decode_mean_acceptance_length",
        "Mean tokens emitted per verification step",
        value=c.get("spec_mean_acceptance_length", 0.0),
    )
