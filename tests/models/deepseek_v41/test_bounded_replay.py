"""SWA bounded replay for V4.1 (``swa_bounded_replay=True``): the decoder layers (after the last Full layer) run
on the last ``sliding_window`` rows of each prefill chunk only. Not exact, opt-in; the default is the exact path.

Checked on reindex_r2 (window 8, decoder layers 4-6), float32, unquantized KV:
- the decoder runs on fewer rows (its window pools filled with NaN first: nothing unwritten is read), and a chunk no longer than the window is bit-identical to the exact path;
- generated tokens' logprobs stay within the measured distance of the exact path (teacher-forced), and differ
  from it (the replayed path is really taken);
- a request in a batch equals itself alone under the same chunking (batch invariance holds);
- a prefix-cache hit resumes without the decoder's window (never cached, never read below the hit) and the run
  is repeatable.
``benchmarks/v41_bounded_replay.py`` measures every golden config; figures in ``docs/models.md``.
"""

from __future__ import annotations

import pytest

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.models.deepseek_v41.block import Block, Exit
from tests.models.deepseek_v41.goldens import checkpoint, prompts

NAME = "reindex_r2"
DECODER_POOLS = {f"layers.{i}.attn.swa_kv" for i in (4, 5, 6)}
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0, ignore_eos=True)
#: mean |logprob diff| of generated tokens against the exact path: measured 0.117 on this file's prompts in
#: chunks of 48 (a window of 8 keeps little); the bound leaves 1.5x for another float32 summation order
MEAN_BOUND = 0.2


def _llm(**kw) -> LLM:
    return LLM(model=str(checkpoint(NAME)), dtype="float32", kv_cache_dtype="unquantized", **kw)


def _ids(min_len: int, max_len: int) -> list[list[int]]:
    g, idx = prompts(NAME)
    return [x for x in (g[f"prompt.{i}.ids"].tolist() for i in idx) if min_len <= len(x) <= max_len]


def _lp(out) -> list[float]:
    return [out.outputs[0].logprobs[j][t].logprob for j, t in enumerate(out.outputs[0].token_ids)]


def _poison(llm: LLM) -> None:
    """Every decoder window pool filled with NaN."""
    for name, pool in llm.engine.runner.kv.items():
        if name in DECODER_POOLS:
            pool.fill_(float("nan"))


@pytest.fixture
def decoder_rows(monkeypatch) -> list[int]:
    """Rows the first decoder layer ran on, per forward."""
    rows: list[int] = []
    original = Block.forward

    def counting(self, h, *args):
        if self.attn.window_group == "decoder" and self.attn.role.layer == 4:
            rows.append(h.rows if isinstance(h, Exit) else h.shape[0])
        return original(self, h, *args)

    monkeypatch.setattr(Block, "forward", counting)
    return rows


def test_the_decoder_runs_on_the_window_and_stays_near_the_exact_path(decoder_rows):
    ids = _ids(20, 200)[:3]
    assert len(ids) == 3
    batch = [{"prompt_token_ids": x} for x in ids]
    exact = _llm(enable_prefix_caching=False, max_num_batched_tokens=48)
    ref = exact.generate(batch, GREEDY, use_tqdm=False)
    exact_rows = sum(decoder_rows)
    decoder_rows.clear()
    replay = _llm(enable_prefix_caching=False, max_num_batched_tokens=48, swa_bounded_replay=True)
    _poison(replay)  # rows dropped from a chunk leave the decoder's window there unwritten: never read
    got = replay.generate(batch, GREEDY, use_tqdm=False)
    assert sum(decoder_rows) < exact_rows / 2, (sum(decoder_rows), exact_rows)
    forced = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    full = [{"prompt_token_ids": x + a.outputs[0].token_ids} for x, a in zip(ids, got, strict=True)]
    diffs = []
    for x, a, f in zip(ids, got, exact.generate(full, forced, use_tqdm=False), strict=True):
        tf = f.prompt_logprobs
        diffs += [
            abs(v - tf[len(x) + j][t].logprob) for j, (t, v) in enumerate(zip(a.outputs[0].token_ids, _lp(a)))
        ]
    mean = sum(diffs) / len(diffs)
    print(f"bounded replay vs exact: mean |diff| {mean:.3e}, max {max(diffs):.3e} over {len(diffs)} tokens")
    assert 1e-4 < mean <= MEAN_BOUND
    assert any(a.outputs[0].token_ids[0] == b.outputs[0].token_ids[0] for a, b in zip(got, ref))


def test_a_chunk_within_the_window_is_the_exact_path():
    ids = [x[:8] for x in _ids(20, 200)] + _ids(1, 8)
    batch = [{"prompt_token_ids": x} for x in ids]
    ref = _llm(enable_prefix_caching=False).generate(batch, GREEDY, use_tqdm=False)
    got = _llm(enable_prefix_caching=False, swa_bounded_replay=True).generate(batch, GREEDY, use_tqdm=False)
    for a, b in zip(got, ref, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert _lp(a) == _lp(b)


def test_a_request_in_a_batch_equals_itself_alone():
    ids = _ids(20, 200)[:3]
    llm = _llm(enable_prefix_caching=False, swa_bounded_replay=True, max_num_batched_tokens=1024)
    together = llm.generate([{"prompt_token_ids": x} for x in ids], GREEDY, use_tqdm=False)
    for x, a in zip(ids, together, strict=True):
        alone = llm.generate([{"prompt_token_ids": x}], GREEDY, use_tqdm=False)[0]
        assert a.outputs[0].token_ids == alone.outputs[0].token_ids
        assert _lp(a) == _lp(alone)


def test_a_prefix_cache_hit_resumes_without_the_decoder_window():
    """Between the two requests every decoder window pool is filled with NaN: the hit's first chunk would read
    it below the resume point if it were not masked there."""
    (x,) = _ids(150, 200)[:1]
    second = x[:120] + [t % 50 + 3 for t in x[120:]]
    runs = []
    for poison in (False, True):
        llm = _llm(swa_bounded_replay=True, max_num_batched_tokens=64)
        first = llm.generate([{"prompt_token_ids": x}], GREEDY, use_tqdm=False)[0]
        if poison:
            _poison(llm)
        hit = llm.generate([{"prompt_token_ids": second}], GREEDY, use_tqdm=False)[0]
        assert hit.num_cached_tokens >= 64
        assert not llm.engine.kv.pools["decoder"].cached and llm.engine.kv.pools["compressed"].cached
        llm.engine.kv.check([])
        runs.append((first.outputs[0].token_ids, _lp(first), hit.outputs[0].token_ids, _lp(hit)))
    assert runs[0] == runs[1]
