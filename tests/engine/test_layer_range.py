"""The layer-range seam: with ``swa_bounded_replay`` the toy's decoder layers run on the last rows of each
chunk only, and every result equals running every layer on every row, through chunked prefill, batching,
prompt logprobs and prefix-cache hits."""

from __future__ import annotations

import random

import pytest
import torch

from deepinfer_core import SamplingParams
from deepinfer_core.config import ConfigError, load_config
from deepinfer_core.engine.layer_range import BoundedReplay, bounded_replay, tail_batch
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.batch import ForwardBatch

from .conftest import toy_backends
from .toy_csa2 import REPLAY, ToyCSA2LM, make_csa2_llm
from .toy_model import ToyHybridLM

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2, ignore_eos=True)


def _prompts(lengths: list[int], shared: int = 0, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    base = [rng.randrange(2, 96) for _ in range(shared)]
    return [{"prompt_token_ids": base + [rng.randrange(2, 96) for _ in range(n)]} for n in lengths]


def _logprobs(out) -> list[dict[int, float]]:
    return [{t: v.logprob for t, v in p.items()} for p in out.outputs[0].logprobs]


def _assert_same(ref, outs) -> None:
    for a, b in zip(ref, outs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert _logprobs(a) == _logprobs(b)
        assert a.prompt_logprobs == b.prompt_logprobs


def test_decoder_on_the_last_rows_of_each_chunk_gives_every_row_s_result():
    prompts = _prompts([200, 37, 5, 90, 130])
    full = make_csa2_llm(enable_prefix_caching=False, max_num_batched_tokens=64)
    ref = full.generate(prompts, GREEDY, use_tqdm=False)
    bounded = make_csa2_llm(enable_prefix_caching=False, max_num_batched_tokens=64, swa_bounded_replay=True)
    _assert_same(ref, bounded.generate(prompts, GREEDY, use_tqdm=False))
    rows_full, rows_bounded = full.engine.model.decoder_rows, bounded.engine.model.decoder_rows
    assert rows_full == sum(len(p["prompt_token_ids"]) + 5 for p in prompts)
    assert rows_bounded < rows_full // 2


def test_prompt_logprobs_keep_every_row_of_their_request_only():
    prompts = _prompts([120, 80, 150])
    params = [GREEDY, SamplingParams(max_tokens=3, temperature=0.0, logprobs=1, prompt_logprobs=1), GREEDY]
    ref = make_csa2_llm(max_num_batched_tokens=48).generate(prompts, params, use_tqdm=False)
    llm = make_csa2_llm(max_num_batched_tokens=48, swa_bounded_replay=True)
    _assert_same(ref, llm.generate(prompts, params, use_tqdm=False))
    assert llm.engine.model.decoder_rows < 80 + 3 + (120 + 150) // 2


def test_a_cache_hit_replays_the_window_and_matches_every_layer_on_every_row():
    prompts = _prompts([40, 3, 70, 12], shared=150)
    ref = [
        make_csa2_llm(enable_prefix_caching=False).generate([p], GREEDY, use_tqdm=False)[0] for p in prompts
    ]
    llm = make_csa2_llm(max_num_batched_tokens=48, swa_bounded_replay=True)
    outs = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    _assert_same(ref, outs)
    lengths = [len(p["prompt_token_ids"]) for p in prompts]
    assert [o.num_cached_tokens for o in outs[1:]] == [min(n - REPLAY, 150) // 16 * 16 for n in lengths[1:]]
    assert not llm.engine.kv.pools["dec"].cached and llm.engine.kv.pools["global"].cached
    llm.engine.kv.check([])


def test_a_window_too_short_for_the_model_changes_its_logits():
    """The comparisons above can fail: the toy's last row needs 7 decoder rows, and with 4 it differs."""
    prompts = _prompts([90])
    ref = make_csa2_llm(enable_prefix_caching=False).generate(prompts, GREEDY, use_tqdm=False)[0]
    short = make_csa2_llm(replay=4, enable_prefix_caching=False, swa_bounded_replay=True)
    assert _logprobs(short.generate(prompts, GREEDY, use_tqdm=False)[0]) != _logprobs(ref)


def _batch(lens: list[int], logits: list[int]) -> ForwardBatch:
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    positions = [100 * b + i for b, n in enumerate(lens) for i in range(n)]
    return ForwardBatch(
        input_ids=torch.arange(qsl[-1]) + 1000,
        positions=torch.tensor(positions),
        query_start_loc=torch.tensor(qsl),
        context_lens=torch.tensor([100 * b + n for b, n in enumerate(lens)]),
        block_tables={"g": torch.zeros(len(lens), 1, dtype=torch.int64)},
        block_size=16,
        logits_indices=torch.tensor(logits),
    )


def test_the_tail_is_the_last_rows_of_each_request_with_its_metadata():
    # request 0: 20 rows, samples its last; 1: one decode row; 2: 30 rows, prompt logprobs from row 23
    batch = _batch([20, 1, 30], [19, 20, 23, 24, 50])
    tail = tail_batch(batch, BoundedReplay(3, 8, frozenset()))
    assert tail.first_layer == 3
    rows = list(range(12, 20)) + [20] + list(range(21, 51))
    assert tail.rows.tolist() == rows
    sub = tail.batch
    assert sub.query_start_loc.tolist() == [0, 8, 9, 39]
    assert sub.positions.tolist() == batch.positions[rows].tolist()
    assert sub.input_ids.tolist() == batch.input_ids[rows].tolist()
    assert sub.context_lens is batch.context_lens and sub.block_tables is batch.block_tables
    assert sub.logits_indices.tolist() == [7, 8, 11, 12, 38]
    assert [rows[i] for i in sub.logits_indices.tolist()] == batch.logits_indices.tolist()
    # late state exists from the first kept row (request 0: position 12), else from the start
    assert tail.state_from.tolist() == [12, 0, 0]


def test_state_from_marks_what_a_cache_hit_left_unwritten():
    replay = BoundedReplay(3, 8, frozenset())
    # positions 200..204 of request 2 resumed at 196: its window (8) reaches below the hit -> a tail of every row
    tail = tail_batch(_batch([8, 1, 5], [7, 8, 13]), replay, [0, 0, 196])
    assert tail.rows.tolist() == list(range(14)) and tail.state_from.tolist() == [0, 0, 196]
    # a hit further back than the window: nothing to mask, nothing dropped
    assert tail_batch(_batch([8, 1, 5], [7, 8, 13]), replay, [0, 0, 192]) is None
    # rows dropped: the first kept row, not the hit
    tail = tail_batch(_batch([20], [19]), replay, [0])
    assert tail.state_from.tolist() == [12]


def test_no_tail_when_nothing_is_dropped():
    replay = BoundedReplay(3, 8, frozenset())
    assert tail_batch(_batch([8, 1, 5], [7, 8, 13]), replay) is None
    assert tail_batch(_batch([20], [0, 19]), replay) is None  # logits wanted from row 0: every row
    assert tail_batch(_batch([20], [19]), None) is None


def test_the_tail_moves_with_its_batch():
    batch = _batch([20, 3], [19, 22])
    batch.tail = tail_batch(batch, BoundedReplay(1, 4, frozenset()))
    moved = batch.to(torch.device("cpu"))
    assert moved.tail.rows.tolist() == [16, 17, 18, 19, 20, 21, 22]
    assert moved.tail.batch.block_tables is moved.block_tables
    assert moved.tail.batch.context_lens is moved.context_lens
    assert moved.tail.state_from.tolist() == [16, 0]


def _engine(model, **cfg) -> LLMEngine:
    return LLMEngine(
        load_config(environ={}, kv_cache_memory_bytes=8 << 20, max_model_len=512, **cfg),
        model,
        toy_backends(),
    )


def test_bounded_replay_is_off_by_default_and_refused_where_it_cannot_hold():
    assert _engine(ToyCSA2LM()).runner.bounded_replay is None
    on = _engine(ToyCSA2LM(), swa_bounded_replay=True).runner.bounded_replay
    assert on == BoundedReplay(3, REPLAY, frozenset({"dec"}))
    with pytest.raises(ConfigError, match="declares no bounded replay"):
        _engine(ToyHybridLM(), swa_bounded_replay=True)

    class Mixed(ToyCSA2LM):  # decoder state in a group the encoder writes too
        def cache_specs(self):
            return [CacheSpec(s.name, "swa" if s.group == "dec" else s.group, s.tokens_per_entry, s.entry_shape, s.dtype, s.window, s.writer, s.readers, s.packed) for s in super().cache_specs()]  # fmt: skip

    with pytest.raises(ValueError, match="groups of its own"):
        _engine(Mixed(), swa_bounded_replay=True)
    with pytest.raises(ValueError, match="window < 3"):
        _engine(ToyCSA2LM(replay=3), swa_bounded_replay=True)


def test_bounded_replay_is_refused_with_a_proposer_that_reads_hidden_states():
    model = ToyCSA2LM()
    with pytest.raises(ConfigError, match="hidden"):
        bounded_replay(model, model.cache_specs(), enabled=True, taps_hidden=True)
