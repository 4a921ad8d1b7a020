"""Image input through the engine (V4.1, reference backend, float32, unquantized KV) against DeepSeek's
reference ``model.py`` with the vision port (``vl_goldens``): prompt logprobs of three prompts with one,
two and two adjacent images, batched with a text-only prompt, in one pass and with chunks that cut through
the spans; a different image, or a checkpoint whose ``bias_vl`` is its ``bias``, moves them far."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from deepinfer_core import LLM, SamplingParams
from tests.models.deepseek_v41.vl_goldens import (
    CHECKPOINT,
    engine_input,
    expanded_ids,
    image,
    logprob_diffs,
    num_prompts,
)

#: the engine against the reference, every prompt position (measured: at most 1.6e-5)
TOL = 1e-4
#: what a wrong image or a missing bias_vl must move at least one position by (measured: above 1)
MOVED = 0.1
PROMPT_LOGPROBS = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)


def _llm(checkpoint=CHECKPOINT, **kw) -> LLM:
    return LLM(model=str(checkpoint), dtype="float32", kv_cache_dtype="unquantized", block_size=8, **kw)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return _llm()


def _max_diffs(outs) -> list[float]:
    return [float(logprob_diffs(i, o).max()) for i, o in enumerate(outs)]


def test_prompt_logprobs_with_images_equal_the_reference_in_a_batch_with_text(llm):
    outs = llm.generate([engine_input(i) for i in range(num_prompts())], PROMPT_LOGPROBS, use_tqdm=False)
    for i, out in enumerate(outs):
        assert out.prompt_token_ids == expanded_ids(i)  # each placeholder became its image's span
    assert max(_max_diffs(outs)) <= TOL


def test_chunked_prefill_through_image_spans_equals_the_reference():
    llm = _llm(max_num_batched_tokens=8)  # 8-token steps: every span is cut (spans of 10 to 32 tokens)
    outs = llm.generate([engine_input(i) for i in range(num_prompts())], PROMPT_LOGPROBS, use_tqdm=False)
    assert max(_max_diffs(outs)) <= TOL


def test_a_different_image_moves_the_logprobs(llm):
    other = image("a").transpose(0)  # the same size, mirrored: the same span, other content
    out = llm.generate([engine_input(0, [other])], PROMPT_LOGPROBS, use_tqdm=False)[0]
    assert out.prompt_token_ids == expanded_ids(0)
    assert float(logprob_diffs(0, out).max()) > MOVED


def test_bias_vl_steers_the_image_positions(tmp_path):
    """The same checkpoint with every ``bias_vl`` replaced by the layer's ``bias`` misses the reference."""
    copy = tmp_path / "checkpoint"
    shutil.copytree(CHECKPOINT, copy)
    tensors = {f: load_file(str(f)) for f in copy.glob("*.safetensors")}
    biases = {k: v for t in tensors.values() for k, v in t.items() if k.endswith("gate.bias")}
    for f, t in tensors.items():
        swapped = {k: biases[k.removesuffix("_vl")] if k.endswith("bias_vl") else v for k, v in t.items()}
        save_file(swapped, str(f))
    outs = _llm(copy).generate([engine_input(i) for i in range(3)], PROMPT_LOGPROBS, use_tqdm=False)
    assert min(_max_diffs(outs)) > MOVED
