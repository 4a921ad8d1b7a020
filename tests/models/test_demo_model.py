"""The shipped demo checkpoint still models held-out Python: bits per byte through the reference backend
on a fixed held-out sample (files the training never saw) stay under the recorded bound. Any change to the
model code, loader or ops that breaks real weights moves this number far past the bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepinfer_core import LLM
from deepinfer_core.demo import demo_checkpoint
from deepinfer_core.evaluation import heldout_score

SAMPLE = Path(__file__).parent.parent / "data" / "demo_heldout.txt"
# Measured 2026-12-02 on this sample (see benchmarks/RESULTS.md, "Demo model"): BF16 1.279 bits/byte.
# The bound leaves ~13% for platform rounding; a broken model lands near the uniform guess (3.6).
BPB_BOUND = 1.45
# MTP k=1 acceptance on this sample (96-token prompts, 24 greedy tokens): 0.661 measured 2026-12-02.
MTP_ACCEPTANCE_BOUND = 0.5
UNIFORM_BPB = 13.0 / 3.6  # a uniform guess over 8192 tokens at ~3.6 bytes per token


@pytest.fixture(scope="module")
def sample() -> list[str]:
    return SAMPLE.read_text().split("\n# --- ")


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_heldout_bits_per_byte_stay_under_the_recorded_bound(sample, variant, tmp_path_factory):
    """FP8: the demo checkpoint quantized on load by the project's own tool (nothing FP8 is shipped)."""
    cache = tmp_path_factory.mktemp("quantized")
    quant = {} if variant == "bf16" else {"quantization": "fp8", "quantization_cache_dir": str(cache)}
    llm = LLM(str(demo_checkpoint("demo-v4")), kv_cache_memory_bytes=32 << 20, **quant)
    if variant == "fp8":
        [copy] = cache.iterdir()
        assert json.loads((copy / "config.json").read_text())["quantization_config"]["quant_method"] == "fp8"
    score = heldout_score(llm, sample, window=256)
    assert score.tokens > 1000
    assert score.bits_per_byte < BPB_BOUND, f"{variant}: {score.bits_per_byte:.3f} bits/byte"
    assert score.bits_per_byte < UNIFORM_BPB / 2


def test_mtp_drafts_are_accepted_above_the_recorded_bound(sample):
    """MTP (k=1) greedy drafting on held-out prompts through the engine: the trained MTP head's drafts are
    accepted far more often than chance, and speculative greedy output equals plain greedy output."""
    from deepinfer_core import SamplingParams

    def run(spec):
        llm = LLM(str(demo_checkpoint("demo-v4")), kv_cache_memory_bytes=32 << 20, speculative_config=spec)
        tok = llm.get_tokenizer()
        prompts = [
            {"prompt_token_ids": [tok.bos_token_id, *tok(t, add_special_tokens=False).input_ids[:96]]}
            for t in sample
        ]
        outs = llm.generate(
            prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False
        )
        return [o.outputs[0].token_ids for o in outs], llm.get_stats()

    plain, _ = run(None)
    spec, stats = run({"method": "mtp", "num_speculative_tokens": 1})
    assert spec == plain
    rate = stats["spec_num_accepted_tokens"] / stats["spec_num_draft_tokens"]
    assert rate > MTP_ACCEPTANCE_BOUND, f"MTP k=1 acceptance {rate:.3f}"
