"""The V4.1 model runs its fused steps through the backends' resolved table: a backend's declared fused ops are
the ones called (the single-pass mHC site entries among them), and generation equals that of a backend that
declares none (the core's compositions of the same plain ops), bit for bit."""

from __future__ import annotations

import random
from dataclasses import replace

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.ops.fusions import Fusion
from tests.models.deepseek_v4.test_fused_steps import CALLS, DeclaringAttention, DeclaringDense
from tests.models.deepseek_v41.goldens import checkpoint


def _generate(declaring: bool):
    llm = LLM(model=str(checkpoint("flash_mini")), dtype="float32", kv_cache_dtype="unquantized")
    if declaring:
        model = llm.engine.model
        model.backends = replace(model.backends, dense=DeclaringDense(), attention=DeclaringAttention())
        assert model.backends.fused.declared == set(Fusion)
    rng = random.Random(2)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 300) for _ in range(n)]} for n in (7, 30)]
    params = SamplingParams(max_tokens=3, temperature=0.0, logprobs=2, ignore_eos=True)
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def test_v41_calls_its_declared_fused_ops_and_matches_the_compositions():
    plain = _generate(False)
    CALLS.clear()
    fused = _generate(True)
    for a, b in zip(plain, fused, strict=True):
        assert a.token_ids == b.token_ids
        assert [{t: lp.logprob for t, lp in d.items()} for d in a.logprobs] == [
            {t: lp.logprob for t, lp in d.items()} for d in b.logprobs
        ]
    assert {
        Fusion.HC_SITE_NORM,
        Fusion.HC_POST_SITE_NORM,
        Fusion.RMS_NORM_ROPE_STORE_KV,
        Fusion.LINEAR_F32,
        Fusion.SWIGLU_MLP_ADD,
        Fusion.ROPE_SPARSE_ATTENTION_UNROPE,
        Fusion.INDEX_QUERY,
    } <= set(CALLS)
    # each forward: every block's FFN site folds its attention's exit (hc_post_site_norm), and every block's
    # attention site folds the block before's FFN exit too, except the first block's and an Engram block's
    # (Engram reads the streams first): those enter from the streams (hc_site_norm). flash_mini: 9 blocks,
    # Engram at 0 and 3
    blocks, from_streams = 9, 2
    forwards = CALLS[Fusion.HC_SITE_NORM] // from_streams
    assert forwards > 0 and CALLS[Fusion.HC_SITE_NORM] == forwards * from_streams
    assert CALLS[Fusion.HC_POST_SITE_NORM] == forwards * (2 * blocks - from_streams)
