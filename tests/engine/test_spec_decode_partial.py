"""Partly accepted draft rounds, where random MTP weights accept almost nothing: proposers whose drafts
agree with the target. An oracle replays the target's own greedy continuation with deliberate wrong tokens,
so rounds accept 0..k drafts, across the CSA (4) and HCA (16) compression windows and the sliding window
(8) of a tiny random DeepSeek-V4 checkpoint.

- Greedy output equals non-speculative greedy output (logprobs within 1e-5), and drafts were accepted at
  positions 2 and beyond.
- Rollback is exact, bit for bit: after every partly accepted round, every cache entry a next step may read
  (sliding window, compressed KV and indexer keys, and the MTP module's own window) equals that of a run
  that only ever saw the accepted tokens.
"""

from __future__ import annotations

import random

import pytest
import torch

from deepinfer_core import SamplingParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.engine.loader import load
from deepinfer_core.runtime import build_runtime
from deepinfer_core.spec_decode import Proposer
from deepinfer_spec_decode.mtp import MTPProposer

from ..models.deepseek_v4.test_mtp import MTPReference
from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf, save_deepseek
from ..outputs import assert_same_outputs

VOCAB = 320
MAX_TOKENS = 30


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    hf = build_hf(Schedule("engine", (CSA, HCA)), seed=0)
    return str(save_deepseek(hf, tmp_path_factory.mktemp("v4mtp"), extra=MTPReference(hf).deepseek_tensors()))


def _prompts() -> list[dict]:
    rng = random.Random(3)
    return [{"prompt_token_ids": [rng.randrange(2, VOCAB) for _ in range(n)]} for n in (5, 14, 31)]


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **kw)


def _engine(path: str, spec: dict | None = None, extra: dict | None = None, **kw) -> LLM:
    kw.setdefault("kv_cache_memory_bytes", 64 << 20)
    kw.setdefault("max_model_len", 256)
    config = load_config(environ={}, model=path, speculative_config=spec, **kw)
    rt = build_runtime(config)
    model, tok = load(config, rt)
    proposers = {**rt.registry.proposers, **(extra or {})}
    return LLM.from_engine(
        LLMEngine(config, model, rt.backends, tok, rt.registry.structured_backends, proposers)
    )


@pytest.fixture(scope="module")
def greedy(ckpt) -> dict[tuple[int, ...], list[int]]:
    """prompt -> prompt + the target's greedy continuation (what the oracle replays)."""
    llm = _engine(ckpt, enable_prefix_caching=False)
    outs = llm.generate(_prompts(), _params(logprobs=2), use_tqdm=False)
    return {tuple(o.prompt_token_ids): o.prompt_token_ids + o.outputs[0].token_ids for o in outs}, outs


def _oracle(full: dict[tuple[int, ...], list[int]], ids: list[int], j: int) -> int:
    """Draft ``j`` after ``ids``: the target's next greedy token, made wrong at about one position in four
    (a fixed scatter), so rounds stop at every draft position."""
    seq = next(v for k, v in full.items() if ids[: len(k)] == list(k))
    pos = len(ids) + j
    tok = seq[pos] if pos < len(seq) else 0
    return (tok + 1) % VOCAB if (pos * 37) % 11 < 3 else tok


class OracleProposer(Proposer):
    def __init__(self, full, k: int):
        self.full, self.num_speculative_tokens = full, k

    def propose(self, seqs, limits):
        return [[_oracle(self.full, s.token_ids, j) for j in range(k)] for s, k in zip(seqs, limits)]


class OracleMTP(MTPProposer):
    """The real MTP proposer (catch-up, chained draft steps writing its own window) whose draft tokens are
    the oracle's: a draft head that agrees with the target."""

    def __init__(self, model, k: int, full):
        super().__init__(model, k, sample_drafts=False)
        self.full = full

    def _pick(self, seqs, active, argmax, logits, drafts, q):
        for i in active:
            drafts[i].append(_oracle(self.full, seqs[i].token_ids, len(drafts[i])))


def _accepted_beyond_first(llm: LLM) -> int:
    return sum(llm.engine.spec_stats.accepted_per_position[1:])


@pytest.mark.parametrize("budget", [64, 12])
def test_partial_acceptance_across_compression_windows_keeps_greedy_output(ckpt, greedy, budget):
    full, plain = greedy
    extra = {"oracle": lambda m, s, c: OracleProposer(full, s["num_speculative_tokens"])}
    llm = _engine(
        ckpt, {"method": "oracle", "num_speculative_tokens": 4}, extra, max_num_batched_tokens=budget
    )
    assert_same_outputs(plain, llm.generate(_prompts(), _params(logprobs=2), use_tqdm=False))
    st = llm.engine.spec_stats
    assert _accepted_beyond_first(llm) >= 10
    # rounds stopped at every position: partly accepted rounds, and fully accepted ones
    assert all(a < d for a, d in zip(st.accepted_per_position, st.drafted_per_position))
    assert st.accepted_per_position[-1] > 0


def _visible_state(engine, seq) -> dict[str, torch.Tensor]:
    """Every cache entry (main model and MTP) a next step may read: the sliding window before
    ``num_computed`` and every closed compressed entry."""
    out, bs, n = {}, engine.kv.block_size, seq.num_computed
    for spec in engine.model.cache_specs():
        pool, table, epb = (
            engine.runner.kv[spec.name],
            seq.block_tables[spec.group],
            bs // spec.tokens_per_entry,
        )
        window = engine.kv.windows.get(spec.group) or 0
        entries = range(max(0, n - window), n) if window else range(n // spec.tokens_per_entry)
        rows = [pool[table[e * spec.tokens_per_entry // bs], e % epb] for e in entries]
        out[spec.name] = torch.stack(rows) if rows else torch.empty(0)
    return out


class _ObserveOnly(MTPProposer):
    """MTP that catches up over every verified row and never drafts: its window sees only accepted tokens."""

    def propose(self, seqs, limits):
        return [[] for _ in seqs]


def test_rollback_after_partly_accepted_rounds_is_bit_exact_including_the_mtp_window(ckpt, greedy):
    full, _ = greedy
    spec = _engine(
        ckpt,
        {"method": "oracle_mtp", "num_speculative_tokens": 3},
        {"oracle_mtp": lambda m, s, c: OracleMTP(m, s["num_speculative_tokens"], full)},
    )
    ref = _engine(
        ckpt,
        {"method": "observe", "num_speculative_tokens": 1},
        {"observe": lambda m, s, c: _ObserveOnly(m, 1)},
    )
    prompt = _prompts()[1]
    for llm in (spec, ref):
        llm.engine.add_request(llm.engine.inputs.process(prompt, _params())[0], "r")
    compared = 0
    while spec.engine.has_unfinished():
        before = (spec.engine.spec_stats.num_draft_tokens, spec.engine.spec_stats.num_accepted_tokens)
        spec.engine.step()
        drafted = spec.engine.spec_stats.num_draft_tokens - before[0]
        accepted = spec.engine.spec_stats.num_accepted_tokens - before[1]
        if not spec.engine.requests or not 0 < accepted < drafted:
            continue
        a = spec.engine.requests["r"].seqs[0]
        b = ref.engine.requests["r"].seqs[0]
        while b.num_computed < a.num_computed:
            ref.engine.step()
        assert a.num_computed == b.num_computed and a.token_ids[: a.num_computed + 1] == b.token_ids
        va, vb = _visible_state(spec.engine, a), _visible_state(ref.engine, b)
        assert any(name.startswith("mtp.") for name in va)
        for name in va:
            assert torch.equal(va[name], vb[name]), name
        compared += 1
    assert compared >= 4
