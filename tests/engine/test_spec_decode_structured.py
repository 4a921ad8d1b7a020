"""Structured outputs with n-gram speculation: each draft row gets the grammar mask after the earlier
drafts, rejected drafts are rolled back in the grammar, and the output equals the non-speculative one."""

from __future__ import annotations

import re

from deepinfer_core import SamplingParams, StructuredOutputsParams
from deepinfer_core.config import load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_spec_decode.ngram import make_ngram

from .conftest import toy_backends, v4_tokenizer_and_grammars
from .toy_model import ToyHybridLM


def _llm(spec: bool) -> LLM:
    tok, backends = v4_tokenizer_and_grammars()
    config = load_config(
        environ={},
        kv_cache_memory_bytes=8 << 20,
        max_model_len=256,
        speculative_config={"method": "ngram", "num_speculative_tokens": 4} if spec else None,
    )
    model = ToyHybridLM(vocab_size=129280, max_pos=256)
    model.eos_token_ids = [tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")]
    return LLM.from_engine(
        LLMEngine(config, model, toy_backends(), tok, backends, proposers={"ngram": make_ngram})
    )


PATTERN = r"(ab-){3,5}(cd-){3}[0-9]{2}"  # drafts repeat "ab-" where the grammar moves on


def test_grammar_masks_draft_rows_and_output_is_unchanged():
    prompt = {"prompt_token_ids": [0, 100, 200, 300]}
    so = StructuredOutputsParams(regex=PATTERN)
    params = [
        SamplingParams(temperature=0.0, max_tokens=80, structured_outputs=so),
        SamplingParams(temperature=1.0, seed=3, max_tokens=80, structured_outputs=so),
        SamplingParams(temperature=1.0, seed=4, max_tokens=8, ignore_eos=True),
    ]
    base = _llm(False).generate([prompt] * 3, params, use_tqdm=False)
    llm = _llm(True)
    outs = llm.generate([prompt] * 3, params, use_tqdm=False)
    for a, b in zip(base, outs):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].finish_reason == b.outputs[0].finish_reason
    for o in outs[:2]:
        assert re.fullmatch(PATTERN, o.outputs[0].text), o.outputs[0].text
        assert o.outputs[0].finish_reason == "stop"
    stats = llm.get_stats()
    assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"]
    assert len(llm.engine.structured) == 0, "grammar state leaked"
