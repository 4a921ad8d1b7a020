"""DSpark speculative decoding end to end on a tiny V4.1 checkpoint (``tests/data/v41/flash_mini``: 9 layers,
window 16, three DSpark stages, block 5), float32 with unquantized KV.

- Greedy with DSpark equals greedy without it (tokens, logprobs within 1e-5), batched, under chunked prefill.
- Each greedy draft equals the draft head recomputed on fresh pools over the sequence's whole context (so the
  proposer's catch-up wrote every stage's window at every position, through chunked prefill and verify steps).
- A sampling run reports its acceptance, and its drafts carry ``q``, a distribution under which each draft is
  possible.
- Partly accepted rounds (random DSpark weights accept almost nothing, so an oracle replaces the drafted
  tokens with the target's continuation, made wrong at two positions in thirteen, while the real proposer
  runs its stages and writes its windows): output unchanged, acceptances beyond the first position, and after
  every partly accepted round every cache entry a next step may read, the stages' windows included, equals
  bit for bit that of a run that only ever saw the accepted tokens.
- Also: q of sampled drafts equals the request's distribution over the head's recomputed logits; greedy equality
  under preemption, prefix caching and the trained FP8 KV; seeded n > 1 sampling with greedy drafts emits the
  plain tokens.
- Bad configs fail at construction naming the parameter.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.config import ConfigError, load_config
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.engine.loader import load
from deepinfer_core.engine.sampler import sampling_tensors
from deepinfer_core.kv.budget import group_block_bytes, min_blocks
from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.runtime import build_runtime
from deepinfer_core.testing.kv_harness import PagedKVHarness
from deepinfer_spec_decode.dspark import DSparkProposer
from tests.models.deepseek_v41.goldens import checkpoint
from tests.outputs import assert_same_outputs

CKPT = str(checkpoint("flash_mini"))
VOCAB = 384
MAX_TOKENS = 24


def _engine(spec: dict | None = None, extra: dict | None = None, **kw) -> LLM:
    kw.setdefault("kv_cache_memory_bytes", 32 << 20)
    kw.setdefault("max_model_len", 128)
    kw.setdefault("kv_cache_dtype", "unquantized")
    config = load_config(environ={}, model=CKPT, dtype="float32", speculative_config=spec, **kw)
    rt = build_runtime(config)
    model, tok = load(config, rt)
    reg = rt.registry.proposers  # resolves its "module:attr" entries on lookup
    proposers = {name: reg[name] for name in reg} | (extra or {})
    return LLM.from_engine(
        LLMEngine(config, model, rt.backends, tok, rt.registry.structured_backends, proposers)
    )


def _prompts() -> list[dict]:
    rng = random.Random(7)
    # around the window (16) and the compression groups (ratio 2, candidate blocks of 4)
    return [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in (3, 17, 33)]


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **kw)


def _dspark(k: int = 5, **extra) -> dict:
    return {"method": "dspark", "num_speculative_tokens": k, **extra}


@pytest.fixture(scope="module")
def plain():
    outs = _engine(enable_prefix_caching=False).generate(_prompts(), _params(logprobs=2), use_tqdm=False)
    return {tuple(o.prompt_token_ids): o.prompt_token_ids + o.outputs[0].token_ids for o in outs}, outs


def _head_logits(model, ids: list[int], drafts: list[int]) -> torch.Tensor:
    """The DSpark head's logits ``[len(drafts), V]`` (Markov bias of the token before each slot included) after
    ``ids`` (the last token not computed), recomputed on fresh pools."""
    h = PagedKVHarness(model.cache_specs(), num_blocks=64)
    s = h.add_sequence()
    with torch.inference_mode():
        batch = h.step({s: ids[:-1]}, logits="all")
        model.dspark_context(batch, model.forward(batch, h.pools), h.pools)
        x = model.dspark_block(h.step({s: ids[-1:]}, positions_from={s: len(ids) - 2}), h.pools)[0]
        bias, _ = model.dspark_markov(torch.tensor(ids[-1:] + drafts[:-1]))
        return model.dspark_logits(x)[: len(drafts)] + bias


def _head_drafts(model, ids: list[int], n: int) -> list[int]:
    """The greedy DSpark block after ``ids``, recomputed: each slot's argmax given the drafts before it."""
    out: list[int] = []
    for _ in range(n):
        out.append(int(torch.argmax(_head_logits(model, ids, out + [0])[-1])))
    return out


def _record_drafts(llm: LLM, when=lambda: True) -> list[tuple[list[int], list[int]]]:
    """Wrap the engine's proposer: each non-empty draft it returns while ``when()`` holds, with the sequence's
    tokens at that moment, lands in the returned list."""
    seen: list[tuple[list[int], list[int]]] = []
    original = llm.engine.proposer.propose

    def spy(seqs, limits):
        drafts = original(seqs, limits)
        if when():
            seen.extend((list(s.token_ids), list(d)) for s, d in zip(seqs, drafts) if d)
        return drafts

    llm.engine.proposer.propose = spy
    return seen


@pytest.mark.parametrize("k,budget", [(5, 16), (2, 64)])
def test_dspark_greedy_output_is_unchanged_and_drafts_are_the_heads(plain, k, budget):
    _, outs = plain
    llm = _engine(_dspark(k), max_num_batched_tokens=budget)
    seen = _record_drafts(llm)
    assert_same_outputs(outs, llm.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    s = llm.get_stats()
    assert s["spec_num_draft_tokens"] > 0 and len(s["spec_acceptance_per_position"]) == k
    model = llm.engine.model
    for toks, drafts in seen[:: max(1, len(seen) // 8)]:  # a spread of rounds, every prompt's
        assert drafts == _head_drafts(model, toks, len(drafts))
    _no_leaks(llm)


def test_dspark_with_the_trained_fp8_kv_keeps_greedy_output():
    """``kv_cache_dtype="auto"``: the stages' windows and the block's own KV go through the FP8 window format."""
    kw = dict(kv_cache_dtype="auto", max_num_batched_tokens=16)
    base = _engine(enable_prefix_caching=False, **kw).generate(
        _prompts(), _params(logprobs=2), use_tqdm=False
    )
    llm = _engine(_dspark(5), **kw)
    assert_same_outputs(base, llm.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    assert any(s.name.startswith("mtp.") and s.dtype == torch.uint8 for s in llm.engine.model.cache_specs())


def test_dspark_samples_its_drafts_and_reports_acceptance():
    llm = _engine(_dspark(4))
    got: list = []
    original = llm.engine.proposer.propose

    def spy(seqs, limits):
        drafts = original(seqs, limits)
        got.extend(drafts)
        return drafts

    llm.engine.proposer.propose = spy
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_k=50, seed=3, ignore_eos=True)
    llm.generate(_prompts(), params, use_tqdm=False)
    s = llm.get_stats()
    print("sampled DSpark acceptance per position:", s["spec_acceptance_per_position"])
    assert s["spec_num_draft_tokens"] > 0 and len(s["spec_acceptance_per_position"]) == 4
    assert got and all(d.probs is not None for d in got)
    for d in got:
        q = d.probs
        assert q.shape == (len(d.token_ids), VOCAB)
        torch.testing.assert_close(q.sum(-1), torch.ones(len(d.token_ids)), rtol=0, atol=1e-5)
        assert bool((q[torch.arange(len(d.token_ids)), torch.tensor(d.token_ids)] > 0).all())
        assert int((q > 0).sum(-1).max()) <= 50  # the request's top-k shapes q


def _no_leaks(llm: LLM) -> None:
    for pool in llm.engine.kv.pools.values():
        assert pool.num_in_use == 0


def test_dspark_q_is_the_requests_distribution_over_the_heads_logits():
    """A sampling request's first draft's q equals temperature / top-k applied to the head's logits recomputed
    over the full context; greedy requests in the same batch keep argmax drafts (plain lists)."""
    params = [
        SamplingParams(max_tokens=10, temperature=0.8, top_k=40, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
    ]
    llm = _engine(_dspark(3))
    seen = []
    original = llm.engine.proposer.propose

    def spy(seqs, limits):
        drafts = original(seqs, limits)
        seen.extend((list(s.token_ids), s.params.greedy, d) for s, d in zip(seqs, drafts))
        return drafts

    llm.engine.proposer.propose = spy
    llm.generate(_prompts()[1:], params, use_tqdm=False)
    assert all(isinstance(d, list) for _, greedy, d in seen if greedy)
    sampled = [(t, d) for t, greedy, d in seen if not greedy]
    assert len(sampled) >= 5
    ref = ReferenceSamplingOps()
    for toks, d in sampled[:4]:
        logits = _head_logits(llm.engine.model, toks, list(d.token_ids))
        tensors = sampling_tensors([SimpleNamespace(params=params[0])] * len(d.token_ids))
        torch.testing.assert_close(d.probs, ref.probs(logits, tensors), rtol=0, atol=1e-5)
        assert 0 < float(d.probs[0].max()) < 1
    _no_leaks(llm)


def test_dspark_under_preemption_and_prefix_caching_keeps_greedy_output(plain):
    """A KV budget of the minimum blocks forces preemption (recompute, so the stage windows are rewritten);
    then repeated prompts hit the prefix cache, whose blocks carry the stages' windows too."""
    _, outs = plain
    probe = _engine(_dspark(4), max_num_batched_tokens=16)
    specs, bs = probe.engine.model.cache_specs(), probe.engine.kv_layout.block_size
    need = min_blocks(specs, bs, 128, 16)
    budget = sum(need[g] * b for g, b in group_block_bytes(specs, bs).items())
    llm = _engine(_dspark(4), max_num_batched_tokens=16, kv_cache_memory_bytes=budget)
    assert_same_outputs(outs, llm.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    assert llm.get_stats()["num_preemptions"] > 0
    _no_leaks(llm)
    cached = _engine(_dspark(4), max_num_batched_tokens=24)
    cached.generate(_prompts(), _params(), use_tqdm=False)
    assert_same_outputs(outs, cached.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    assert cached.get_stats()["prefix_cache_hits"] > 0
    _no_leaks(cached)


def test_a_confidence_threshold_shortens_blocks_and_keeps_greedy_output(plain):
    """``confidence_threshold``: a block ends at the first slot whose confidence ``sigmoid(score)`` is below it
    (random heads score around 0.5, so 0.5 cuts some blocks and not others)."""
    _, outs = plain
    full = _engine(_dspark(5))
    full.generate(_prompts(), _params(logprobs=2), use_tqdm=False)
    cut = _engine(_dspark(5, confidence_threshold=0.5))
    assert_same_outputs(outs, cut.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    a, b = full.engine.spec_stats.drafted_per_position, cut.engine.spec_stats.drafted_per_position
    print("drafted per position without / with the threshold:", a, b)
    assert 0 < sum(b) < sum(a) and b[0] > b[-1]


def test_dspark_greedy_drafts_for_seeded_sampling_with_n_samples_emit_the_plain_tokens():
    """``draft_sampling="greedy"``: one-hot drafts, so the verifier draws exactly as plain sampling does."""
    params = [
        SamplingParams(max_tokens=8, temperature=0.9, top_k=40, seed=3, n=2, ignore_eos=True, logprobs=1),
        SamplingParams(max_tokens=6, temperature=1.0, seed=4, n=3, ignore_eos=True, repetition_penalty=1.2),
    ]
    base = _engine(enable_prefix_caching=False).generate(_prompts()[1:], params, use_tqdm=False)
    llm = _engine(_dspark(3, draft_sampling="greedy"), max_num_batched_tokens=24)
    outs = llm.generate(_prompts()[1:], params, use_tqdm=False)
    for a, b in zip(base, outs):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert llm.get_stats()["spec_num_draft_tokens"] > 0
    _no_leaks(llm)


def _oracle(full: dict, ids: list[int], j: int) -> int:
    seq = next(v for k, v in full.items() if ids[: len(k)] == list(k))
    pos = len(ids) + j
    tok = seq[pos] if pos < len(seq) else 0
    return (tok + 1) % VOCAB if (pos * 37) % 13 < 2 else tok


class OracleDSpark(DSparkProposer):
    """The real DSpark proposer (catch-up into its windows, one block step per round) whose drafted tokens are
    the oracle's."""

    def __init__(self, model, k: int, full: dict):
        super().__init__(model, k, sample_drafts=False)
        self.full = full
        model.enable_dspark()

    def _pick(self, seqs, rows, logits, slot, q):
        return [_oracle(self.full, seqs[i].token_ids, slot) for i in rows]


class ObserveOnly(DSparkProposer):
    """DSpark that writes its windows at every verified row and never drafts."""

    def __init__(self, model):
        super().__init__(model, 1)
        model.enable_dspark()

    def propose(self, seqs, limits):
        return [[] for _ in seqs]


@pytest.mark.parametrize("budget", [64, 12])
def test_partly_accepted_rounds_keep_greedy_output(plain, budget):
    full, outs = plain
    extra = {"oracle": lambda m, s, c: OracleDSpark(m, s["num_speculative_tokens"], full)}
    llm = _engine({"method": "oracle", "num_speculative_tokens": 5}, extra, max_num_batched_tokens=budget)
    assert_same_outputs(outs, llm.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    st = llm.engine.spec_stats
    print("oracle drafted / accepted per position:", st.drafted_per_position, st.accepted_per_position)
    assert sum(st.accepted_per_position[1:]) >= 5
    # rounds stopped at several draft positions, and some were accepted whole
    assert sum(a < d for a, d in zip(st.accepted_per_position, st.drafted_per_position)) >= 3
    assert st.accepted_per_position[-1] > 0


def _visible_state(engine, seq) -> dict[str, torch.Tensor]:
    """Every cache entry (target and DSpark stages) a next step may read: the windows before ``num_computed``
    and every closed compressed entry."""
    out, bs, n = {}, engine.kv.block_size, seq.num_computed
    for spec in engine.model.cache_specs():
        pool, table = engine.runner.kv[spec.name], seq.block_tables[spec.group]
        epb = bs // spec.tokens_per_entry
        window = engine.kv.windows.get(spec.group) or 0
        entries = range(max(0, n - window), n) if window else range(n // spec.tokens_per_entry)
        rows = [pool[table[e * spec.tokens_per_entry // bs], e % epb] for e in entries]
        out[spec.name] = torch.stack(rows) if rows else torch.empty(0)
    return out


def test_rollback_after_partly_accepted_rounds_is_bit_exact_including_the_stage_windows(plain):
    full, _ = plain
    spec = _engine(
        {"method": "oracle", "num_speculative_tokens": 4},
        {"oracle": lambda m, s, c: OracleDSpark(m, s["num_speculative_tokens"], full)},
    )
    ref = _engine(
        {"method": "observe", "num_speculative_tokens": 1}, {"observe": lambda m, s, c: ObserveOnly(m)}
    )
    compared = 0
    for i, prompt in enumerate(_prompts()):
        compared += _compare_rounds(spec.engine, ref.engine, prompt, f"r{i}")
    assert compared >= 3


def _compare_rounds(spec, ref, prompt: dict, rid: str) -> int:
    """Step both engines through ``prompt``; after each partly accepted round of ``spec``, step ``ref`` to the same
    computed length and compare the visible state bit for bit. Returns the rounds compared."""
    for engine in (spec, ref):
        engine.add_request(engine.inputs.process(prompt, _params())[0], rid)
    compared = 0
    while spec.has_unfinished():
        before = (spec.spec_stats.num_draft_tokens, spec.spec_stats.num_accepted_tokens)
        spec.step()
        drafted = spec.spec_stats.num_draft_tokens - before[0]
        accepted = spec.spec_stats.num_accepted_tokens - before[1]
        if not spec.requests or not 0 < accepted < drafted:
            continue
        a, b = spec.requests[rid].seqs[0], ref.requests[rid].seqs[0]
        while b.num_computed < a.num_computed:
            ref.step()
        assert a.num_computed == b.num_computed and a.token_ids[: a.num_computed + 1] == b.token_ids
        va, vb = _visible_state(spec, a), _visible_state(ref, b)
        assert sum(name.startswith("mtp.") for name in va) == 3
        for name in va:
            assert torch.equal(va[name], vb[name]), name
        compared += 1
    while ref.has_unfinished():
        ref.step()
    return compared


class _NoDSpark:
    num_dspark_stages = 0


def test_bad_dspark_configs_fail_naming_the_parameter():
    with pytest.raises(ConfigError, match=r"num_speculative_tokens=6 is invalid for method 'dspark'.*1\.\.5"):
        _engine(_dspark(6))
    with pytest.raises(ConfigError, match=r"num_speculative_tokens=9 is invalid"):
        _engine(_dspark(9))
    with pytest.raises(ConfigError, match=r"confidence_threshold=1\.5 is invalid"):
        _engine(_dspark(3, confidence_threshold=1.5))
    from deepinfer_spec_decode.dspark import make_dspark

    with pytest.raises(ConfigError, match=r"method='dspark' needs DSpark weights"):
        make_dspark(_NoDSpark(), _dspark(3), None)


def test_drafts_after_a_pause_for_batch_size_are_the_heads_on_the_whole_context(plain):
    """``disable_by_batch_size=1``: three sequences of different lengths decode without drafts while two or
    more run; the proposer still sees every step, so once one is left its drafts are the DSpark head's,
    recomputed on fresh pools over the whole context (a window that missed the paused steps would differ)."""
    _, outs = plain
    prompts = _prompts()
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=2) for n in (4, 8, 24)]
    llm = _engine(_dspark(3, disable_by_batch_size=1))
    seen = _record_drafts(llm)
    got = llm.generate(prompts, params, use_tqdm=False)
    for o, want in zip(got, outs):  # plain decoding's tokens (a prefix of its 24)
        assert o.outputs[0].token_ids == want.outputs[0].token_ids[: len(o.outputs[0].token_ids)]
    s = llm.get_stats()
    assert s["spec_num_disabled_rounds"] >= 6 and seen
    longest = tuple(prompts[2]["prompt_token_ids"])
    assert all(tuple(toks[: len(longest)]) == longest for toks, _ in seen)  # only the last one drafted
    model = llm.engine.model
    for toks, drafts in seen[:3]:
        assert drafts == _head_drafts(model, toks, len(drafts))
    _no_leaks(llm)


def test_after_a_step_retried_sequence_by_sequence_drafts_are_the_heads_on_the_whole_context(plain):
    """A step that raises is retried one sequence at a time (``LLMEngine._run``); the proposer sees each of
    those steps too, so the drafts of later rounds are still the DSpark head's over the whole context (a window
    missing the retried step's positions would give others), and the output equals plain decoding's."""
    _, outs = plain
    llm = _engine(_dspark(3))
    engine = llm.engine
    state = {"steps": 0, "raised": 0}
    seen = _record_drafts(llm, when=lambda: state["raised"])
    execute = engine.runner.execute

    def flaky(sched):
        state["steps"] += 1
        if state["steps"] == 6 and len(sched.scheduled) > 1:
            state["raised"] += 1
            raise RuntimeError("a transient failure of the batched step")
        return execute(sched)

    engine.runner.execute = flaky
    assert_same_outputs(outs, llm.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    assert state["raised"] == 1 and seen
    model = engine.model
    for toks, drafts in seen[:4]:
        assert drafts == _head_drafts(model, toks, len(drafts))
    _no_leaks(llm)


def test_a_step_the_proposer_never_saw_stops_drafting_until_the_hole_leaves_the_window():
    """Should the engine ever not show the proposer a step (simulated here: one decode step's rows of the longest
    prompt are dropped from ``observe``), the stages' windows miss those positions. That sequence then drafts
    nothing until its block's window (``sliding_window`` positions back) no longer reaches them, and the drafts
    after that are the DSpark head's over the whole context; the output stays plain decoding's."""
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    want = _engine(enable_prefix_caching=False).generate(_prompts(), params, use_tqdm=False)
    llm = _engine(_dspark(3), enable_prefix_caching=False)
    longest = _prompts()[2]["prompt_token_ids"]
    seen = _record_drafts(llm)
    observe, state = llm.engine.proposer.observe, {"calls": 0, "hole_end": None}

    def dropping(rows):
        state["calls"] += 1
        mine = [r for r in rows if list(r.seq.token_ids[: len(longest)]) == longest]
        decoding = mine and mine[0].start >= len(longest)
        if decoding and state["hole_end"] is None and state["calls"] >= 4:
            state["hole_end"] = mine[0].start + mine[0].num_verified
            rows = [r for r in rows if r is not mine[0]]
        return observe(rows)

    llm.engine.proposer.observe = dropping
    got = llm.generate(_prompts(), params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    end, window = state["hole_end"], llm.engine.model.cfg.sliding_window
    assert end is not None
    after = [(toks, d) for toks, d in seen if toks[: len(longest)] == longest and len(toks) - 1 >= end]
    assert all(len(toks) - 1 >= end + window for toks, _ in after)  # nothing while the hole is in the window
    resumed = [(toks, d) for toks, d in after if len(toks) - 1 >= end + window]
    assert resumed  # and drafting resumes once it has left
    model = llm.engine.model
    for toks, drafts in resumed[:3]:
        assert drafts == _head_drafts(model, toks, len(drafts))
    _no_leaks(llm)
