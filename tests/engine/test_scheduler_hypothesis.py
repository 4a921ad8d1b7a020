"""Random arrivals, lengths, aborts and budgets: no block leaks or is written by two owners, every
request finishes exactly once, and the pools are empty of references at the end."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_core.config import load_config
from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.kv.budget import choose_block_size, group_block_bytes, min_blocks
from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.sampling_params import SamplingParams

from .conftest import toy_backends
from .stub_model import StubLM


def _specs(ratios: tuple[int, ...], window: int) -> list[CacheSpec]:
    specs = [CacheSpec("w", "window", 1, (2,), torch.float32, window=window)]
    return specs + [CacheSpec(f"c{r}", "compressed", r, (2,), torch.float32) for r in ratios]


def _check_exclusive_writes(engine: LLMEngine) -> None:
    """A block at or after a running sequence's first uncomputed block is written by it: owned alone."""
    kv = engine.kv
    for seq in engine.scheduler.running:
        first = seq.num_computed // kv.block_size
        for g, table in seq.block_tables.items():
            for b in table[first:]:
                assert kv.pools[g].ref[b] == 1 and kv.pools[g].hash[b] is None, (
                    f"{seq}: shared block {b} written"
                )


requests_st = st.lists(
    st.tuples(
        st.integers(0, 6),  # arrival step
        st.integers(0, 3),  # which shared prefix
        st.integers(1, 70),  # prompt length
        st.integers(1, 30),  # max tokens
        st.integers(1, 3),  # n
        st.one_of(st.none(), st.integers(0, 25)),  # abort at step
        st.booleans(),  # ignore_eos
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ratios=st.sampled_from([(4,), (4, 8), (2,), (8, 16)]),
    window=st.sampled_from([0, 3, 8, 20, 37]),
    max_num_seqs=st.integers(1, 6),
    max_batched=st.integers(1, 120),
    budget_scale=st.floats(1.0, 4.0),
    caching=st.booleans(),
    reqs=requests_st,
)
def test_random_workload_never_leaks_or_loses_requests(
    ratios, window, max_num_seqs, max_batched, budget_scale, caching, reqs
):
    max_len = 100
    specs = _specs(ratios, window)
    bs = choose_block_size(specs, None)
    need = min_blocks(specs, bs, max_len, max_batched)
    nbytes = group_block_bytes(specs, bs)
    budget = int(sum(need[g] * nbytes[g] for g in need) * budget_scale)
    config = load_config(
        environ={},
        max_model_len=max_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        kv_cache_memory_bytes=budget,
        enable_prefix_caching=caching,
    )
    engine = LLMEngine(config, StubLM(specs), toy_backends())
    prefixes = [[(7 * k + i) % 60 + 2 for i in range(80)] for k in range(4)]
    pending = sorted(enumerate(reqs), key=lambda x: x[1][0])
    outputs: dict[str, int] = {}
    expected: dict[str, int] = {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1][0] <= step:
            i, (_, pre, plen, max_tokens, n, _abort, ignore_eos) = pending.pop(0)
            plen = min(plen, max_len - max_tokens)
            if plen < 1:
                continue
            sp = SamplingParams(max_tokens=max_tokens, n=n, temperature=1.0, seed=i, ignore_eos=ignore_eos)
            rid = engine.add_request(ProcessedPrompt(None, prefixes[pre][:plen], sp), request_id=f"r{i}")
            expected[rid] = n
        for i, r in enumerate(reqs):
            if r[5] == step and f"r{i}" in expected:
                engine.abort(f"r{i}")
        for out in engine.step():
            assert out.request_id not in outputs, f"{out.request_id} finished twice"
            outputs[out.request_id] = len(out.outputs)
            assert out.finished
            for c in out.outputs:
                assert c.finish_reason in ("stop", "length", "abort")
                assert len(c.token_ids) <= max_len
        live = [s for r in engine.requests.values() for s in r.seqs]
        engine.kv.check(live)
        _check_exclusive_writes(engine)
        step += 1
        assert step < 5000, "engine does not terminate"
    assert outputs.keys() == expected.keys()
    for rid, n in outputs.items():
        assert n <= expected[rid] and (n == expected[rid] or n >= 1)
    for pool in engine.kv.pools.values():
        assert pool.num_in_use == 0, "blocks still referenced after every request finished"
    engine.kv.check([])
