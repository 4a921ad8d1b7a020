"""The shipped V4.1 demo checkpoint (``deepinfer_core/demo_model_v41``, trained by ``tools/train_demo_v41.py``):
exact against DeepSeek's reference, and its trained DSpark head accepts real drafts.

- Against the reference (``tests/data/v41_demo``, written by ``tools/v41_demo_goldens.py``): prompt logprobs and
  16 greedy tokens of four code prompts (up to 600 tokens), unquantized KV against the reference's ``exact``
  mode, by the criterion of ``test_engine_vs_reference.py``; the trained FP8 / FP4 KV against ``kvq_only`` on
  aggregate (:data:`KVQ_BOUND`); DSpark's draft blocks against ``forward_spec`` by the criterion of
  ``test_dspark.py``.
- DSpark on held-out code: greedy generation with DSpark (k = 5) equals greedy generation without it, token for
  token, and the mean acceptance length and the first draft's acceptance stay above floors set below the
  measured values (``docs/models.md``).
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.demo import demo_checkpoint
from tests.models.deepseek_v41.test_dspark import check_drafts, load
from tests.models.deepseek_v41.test_engine_vs_reference import compare

GOLDENS = Path(__file__).resolve().parents[2] / "data" / "v41_demo"
GREEDY = 16
#: measured here (6 held-out files, 128-token prompts, 40 greedy tokens, k = 5): mean acceptance length 2.00,
#: first draft accepted in 61% of rounds (docs/models.md); random DSpark weights give about 1.0 and 1-6%
FLOOR = {"mean_acceptance_length": 1.75, "first_position": 0.5}


#: the trained FP8 / FP4 KV against the reference's ``kvq_only`` on aggregate: measured mean |logprob diff|
#: 1.4e-3 (median 2.0e-4, max 0.035) and 64/64 greedy tokens, the size of the quantised reference's own noise
#: floor on the tiny configs (1.8e-3, ``test_engine_vs_reference.KVQ_ONLY_FLOOR``); unquantized KV against the
#: same reference is 0.073 apart (44/64 greedy), so the bound sits between the two
KVQ_BOUND = {"mean_abs": 5e-3, "greedy_share": 0.9}


def _golden_run(kv_cache_dtype: str):
    g = load_file(str(GOLDENS / "prompts.safetensors"))
    idx = sorted({int(k.split(".")[1]) for k in g if k.startswith("prompt.")})
    llm = LLM(model="demo", kv_cache_dtype=kv_cache_dtype, dtype="float32", kv_cache_memory_bytes=128 << 20)
    params = SamplingParams(max_tokens=GREEDY, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": g[f"prompt.{i}.ids"].tolist()} for i in idx], params, use_tqdm=False
    )
    return g, idx, outs


@pytest.fixture(scope="module")
def unquantized():
    return _golden_run("unquantized")


def test_the_demo_equals_the_exact_reference(unquantized):
    a = compare(*unquantized, "exact")
    print(
        f"demo: {a.within_1e3:.4f} within 1e-3, median {a.median:.2e}, greedy {a.greedy_equal}/{a.greedy_compared}"
    )
    assert a.diffs.numel() > 800
    assert a.within_1e3 >= 0.97 and a.median <= 1e-4
    assert a.greedy_equal >= a.greedy_compared > 0


def test_the_demo_with_its_trained_kv_formats_matches_the_quantized_reference(unquantized):
    """FP8 window KV, FP4 compressed KV and index keys (``kv_cache_dtype="auto"``) against the reference's
    ``kvq_only`` mode on aggregate; the unquantized engine, as a negative control, is far outside the bound."""
    a = compare(*_golden_run("auto"), "kvq_only")
    mean, share = float(a.diffs.mean()), a.greedy_equal / max(1, a.greedy_compared)
    print(
        f"demo quantized KV vs kvq_only: mean |diff| {mean:.2e}, greedy {a.greedy_equal}/{a.greedy_compared}"
    )
    assert mean <= KVQ_BOUND["mean_abs"] and share >= KVQ_BOUND["greedy_share"]
    control = compare(*unquantized, "kvq_only")
    assert float(control.diffs.mean()) > 5 * KVQ_BOUND["mean_abs"]


def test_the_demo_dspark_drafts_equal_the_reference():
    g = load_file(str(GOLDENS / "dspark.safetensors"))
    check_drafts("demo", g, load("demo", path=demo_checkpoint("demo")))


def _heldout_prompts(tok, n: int, tokens: int) -> list[dict]:
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*.py") if "site-packages" not in p.parts
    )
    held = [r for r in rels if int(hashlib.sha1(r.encode()).hexdigest(), 16) % 20 == 0][:n]
    texts = [(root / r).read_text(encoding="utf-8", errors="replace")[:3000] for r in held]
    return [{"prompt_token_ids": [0, *tok(t, add_special_tokens=False).input_ids[:tokens]]} for t in texts]


@pytest.mark.slow
def test_dspark_on_the_demo_is_lossless_and_accepts_drafts():
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = LLM(model="demo", kv_cache_memory_bytes=128 << 20)
    prompts = _heldout_prompts(plain.get_tokenizer(), 6, 128)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    spec = LLM(model="demo", kv_cache_memory_bytes=128 << 20,
               speculative_config={"method": "dspark", "num_speculative_tokens": 5})  # fmt: skip
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    st = spec.get_stats()
    print({k: st[k] for k in ("spec_mean_acceptance_length", "spec_acceptance_per_position")})
    assert got == want
    assert st["spec_mean_acceptance_length"] >= FLOOR["mean_acceptance_length"]
    assert st["spec_acceptance_per_position"][0] >= FLOOR["first_position"]


def test_drafting_pauses_above_the_batch_size_limit_and_resumes_with_accepted_drafts():
    """``speculative_config.disable_by_batch_size`` on the trained demo: while more sequences run than the
    limit, nobody gets drafts (plain decode steps); when the batch shrinks to the limit the last sequence drafts
    again and its drafts are accepted; the tokens equal plain decoding's throughout. (That the resumed drafts are
    the head's own on the whole context: ``tests/engine/test_spec_decode_dspark.py``.)"""
    tok_src = LLM(model="demo", kv_cache_memory_bytes=64 << 20)
    prompts = _heldout_prompts(tok_src.get_tokenizer(), 3, 64)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 9, 40)]
    want = [o.outputs[0].token_ids for o in tok_src.generate(prompts, params, use_tqdm=False)]
    spec = LLM(model="demo", kv_cache_memory_bytes=64 << 20, speculative_config={
        "method": "dspark", "num_speculative_tokens": 5, "disable_by_batch_size": 1})  # fmt: skip
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    st = spec.get_stats()
    assert got == want
    # three sequences decode for 4 steps and two more for another 4: no drafts in those rounds
    assert st["spec_num_disabled_rounds"] >= 8
    assert st["spec_num_draft_tokens"] > 0 and st["spec_num_accepted_tokens"] > 0


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True])
def test_disable_by_batch_size_is_checked(bad):
    from deepinfer_core.config import ConfigError

    with pytest.raises(ConfigError, match=r"speculative_config.disable_by_batch_size=.*integer >= 1"):
        LLM(model="demo", kv_cache_memory_bytes=64 << 20, speculative_config={
            "method": "dspark", "num_speculative_tokens": 2, "disable_by_batch_size": bad})  # fmt: skip


def test_the_release_numerics_keep_batching_chunking_and_dspark_exact():
    """``activation_quant="fp8"`` quantises each row's GEMM inputs on their own (one scale per 32 values of a row),
    so the engine's invariants hold under it: requests batched and prefilled in small chunks, and decoded with
    DSpark (whose verify step runs several rows of a sequence at once), give each request's tokens and logprobs
    alone in one pass. The numerics differ from the default (the check that the setting took effect)."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    base = LLM(model="demo", kv_cache_memory_bytes=64 << 20, activation_quant="fp8")
    prompts = _heldout_prompts(base.get_tokenizer(), 3, 48)
    alone = [base.generate([p], params, use_tqdm=False)[0].outputs[0] for p in prompts]
    chunked = LLM(
        model="demo", kv_cache_memory_bytes=64 << 20, activation_quant="fp8", max_num_batched_tokens=16
    )
    spec = LLM(model="demo", kv_cache_memory_bytes=64 << 20, activation_quant="fp8",
               speculative_config={"method": "dspark", "num_speculative_tokens": 5})  # fmt: skip
    for llm in (chunked, spec):
        got = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        for a, g in zip(alone, got, strict=True):
            assert g.token_ids == a.token_ids
            for la, lg, t in zip(a.logprobs, g.logprobs, a.token_ids, strict=True):
                assert lg[t].logprob == pytest.approx(la[t].logprob, abs=1e-5)
    assert spec.get_stats()["spec_num_accepted_tokens"] > 0
    scored = SamplingParams(max_tokens=1, prompt_logprobs=0)
    ids = base.generate([prompts[0]], scored, use_tqdm=False)[0].prompt_token_ids

    def prompt_logprobs(llm):
        out = llm.generate([prompts[0]], scored, use_tqdm=False)[0]
        return torch.tensor([out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])

    default = LLM(model="demo", kv_cache_memory_bytes=64 << 20)
    assert (prompt_logprobs(default) - prompt_logprobs(base)).abs().max() > 1e-3


def test_the_layer_input_projections_share_one_matrix():
    """Decode runs one GEMV for ``wq_a`` + ``wkv`` (FP8, 32-row scale blocks) and one for the BF16 compressor and
    index-weight projections of a layer (``SharedInput``); the slots keep row views of the fused matrices, and
    the release numerics mark the fused matrices too (the GEMMs read those)."""
    from deepinfer_core.models.deepseek_v41.model import DeepseekV41ForCausalLM
    from deepinfer_core.ops.weights import QuantizedWeight
    from tests.models.deepseek_v41.test_dspark import BACKENDS

    model = DeepseekV41ForCausalLM.from_checkpoint(demo_checkpoint("demo-v41"), BACKENDS, torch.float32)
    model.enable_dspark()
    attns = [b.attn for b in model.layers + model._stages()]
    for a in attns:
        f = a.x_proj.fused
        assert isinstance(f, QuantizedWeight) and f.format == "fp8_block32"
        assert f.out_features == a.wq_a.value.out_features + a.wkv.value.out_features
        assert a.wq_a.value.data.data_ptr() == f.data.data_ptr()
    sides = [a.side_proj for a in attns if a.side_proj is not None and len(a.side_proj.slots) > 1]
    assert sides and all(isinstance(s.fused, torch.Tensor) for s in sides)
    model.use_activation_quant("fp8")
    assert all(a.x_proj.fused.act_block == 32 for a in attns)
