"""GET /metrics: Prometheus text with the request, token, latency and engine-state series."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import running_server

FAMILIES = {
    "deepinfer_requests",
    "deepinfer_prompt_tokens",
    "deepinfer_generation_tokens",
    "deepinfer_time_to_first_token_seconds",
    "deepinfer_time_per_output_token_seconds",
    "deepinfer_e2e_request_latency_seconds",
    "deepinfer_num_requests_running",
    "deepinfer_num_requests_waiting",
    "deepinfer_kv_cache_usage_ratio",
    "deepinfer_prefix_cache_queries",
    "deepinfer_prefix_cache_hits",
    "deepinfer_prefix_cache_hit_rate",
    "deepinfer_spec_decode_draft_tokens",
    "deepinfer_spec_decode_accepted_tokens",
    "deepinfer_spec_decode_acceptance_rate",
    "deepinfer_spec_decode_mean_acceptance_length",
    "deepinfer_num_preemptions",
}


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_requests_tokens_and_latencies(toy):
    with running_server(toy.llm) as url:
        prompt = list(range(2, 34))  # two full blocks: the second request finds them in the prefix cache
        for _ in range(2):
            r = httpx.post(
                url + "/v1/completions",
                json={"prompt": prompt, "max_tokens": 5, "temperature": 0},
                timeout=60,
            )
            assert r.status_code == 200
        assert (
            httpx.post(
                url + "/v1/completions", json={"prompt": "a", "temperature": -1}, timeout=60
            ).status_code
            == 400
        )
        text = httpx.get(url + "/metrics", timeout=60).text
    assert FAMILIES <= {f.name for f in text_string_to_metric_families(text)}
    s = _samples(text)
    assert s[("deepinfer_requests_total", (("outcome", "length"),))] == 2
    assert s[("deepinfer_requests_total", (("outcome", "bad_request"),))] == 1
    assert s[("deepinfer_prompt_tokens_total", ())] == 2 * len(prompt)
    assert s[("deepinfer_generation_tokens_total", ())] == 10
    assert s[("deepinfer_time_to_first_token_seconds_count", ())] == 2
    assert s[("deepinfer_time_per_output_token_seconds_count", ())] == 2
    assert s[("deepinfer_num_requests_running", ())] == 0
    assert s[("deepinfer_prefix_cache_hits_total", ())] > 0
    assert 0 < s[("deepinfer_prefix_cache_hit_rate", ())] <= 1
    assert {k[1] for k in s if k[0] == "deepinfer_kv_cache_usage_ratio"} == {
        (("group", "compressed"),),
        (("group", "window"),),
    }


def test_speculative_acceptance_metrics_are_the_engines_counters():
    """An n-gram speculative engine behind the server: a repetitive prompt gets drafts accepted, and
    /metrics reports the engine's own counts."""
    pytest.importorskip("deepinfer_spec_decode")
    from deepinfer_core.engine.async_llm import AsyncLLM

    from ..engine.test_spec_decode_ngram import ngram, spec_llm

    llm = AsyncLLM(spec_llm(ngram(4)).engine)
    try:
        with running_server(llm) as url:
            body = {
                "prompt": [11, 12, 13, 14, 15] * 8,
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
            }
            r = httpx.post(url + "/v1/completions", json=body, timeout=60)
            assert r.json()["usage"]["completion_tokens"] == 24
            counters = llm.wait_for_stats(lambda s: s.num_running == 0, 60).counters
            s = _samples(httpx.get(url + "/metrics", timeout=60).text)
    finally:
        llm.shutdown()
    drafts, accepted = (
        s[("deepinfer_spec_decode_draft_tokens_total", ())],
        s[("deepinfer_spec_decode_accepted_tokens_total", ())],
    )
    assert 0 < accepted <= drafts
    assert (drafts, accepted) == (counters["spec_num_draft_tokens"], counters["spec_num_accepted_tokens"])
    assert s[("deepinfer_spec_decode_acceptance_rate", ())] == pytest.approx(accepted / drafts)
    assert s[("deepinfer_spec_decode_mean_acceptance_length", ())] > 1
