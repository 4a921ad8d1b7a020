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


def _spy_passes(llm: LLM, monkeypatch) -> list[list]:
    """Each tower pass's images, as the engine hands them to the model."""
    passes: list[list] = []
    encode = llm.engine.model.encode_images

    def spy(images):
        passes.append(list(images))
        return encode(images)

    monkeypatch.setattr(llm.engine.model, "encode_images", spy)
    return passes


def test_the_encoder_budget_bounds_every_tower_pass_and_keeps_the_reference_logprobs(monkeypatch):
    """``max_encoder_patches``: one image a pass by default; with a budget, a step's images packed into passes
    within it; with chunks, an image is encoded in the step that first reaches its span, once."""
    prompts = [engine_input(i) for i in range(num_prompts())]
    default = _llm()
    one_each = _spy_passes(default, monkeypatch)
    _ = default.generate(prompts, PROMPT_LOGPROBS, use_tqdm=False)
    sizes = sorted(p[0].patches.shape[0] for p in one_each)
    assert all(len(p) == 1 for p in one_each) and len(one_each) >= 5  # five images, one a pass
    budget = sizes[-1] + sizes[0]  # the largest image and the smallest fit together
    packed_llm = _llm(max_encoder_patches=budget)
    packed = _spy_passes(packed_llm, monkeypatch)
    outs = packed_llm.generate(prompts, PROMPT_LOGPROBS, use_tqdm=False)
    assert max(_max_diffs(outs)) <= TOL
    assert all(sum(im.patches.shape[0] for im in p) <= budget for p in packed)
    assert len(packed) < len(one_each)  # some pass packed several images
    assert sorted(im.patches.shape[0] for p in packed for im in p) == sizes  # each image once
    chunked_llm = _llm(max_encoder_patches=budget, max_num_batched_tokens=8)
    chunked = _spy_passes(chunked_llm, monkeypatch)
    outs = chunked_llm.generate(prompts, PROMPT_LOGPROBS, use_tqdm=False)
    assert max(_max_diffs(outs)) <= TOL
    assert sorted(im.patches.shape[0] for p in chunked for im in p) == sizes  # each image once
    assert len(chunked) >= len(sizes) - 1  # encoded as the chunks reach them, not per request up front


def test_an_image_over_the_encoder_budget_fails_alone_naming_the_setting(monkeypatch):
    probe = _llm()
    passes = _spy_passes(probe, monkeypatch)
    probe.generate([engine_input(0)], PROMPT_LOGPROBS, use_tqdm=False)
    patches = passes[0][0].patches.shape[0]
    llm = _llm(max_encoder_patches=patches - 1)
    text = {"prompt_token_ids": expanded_ids(3)} if num_prompts() > 3 else {"prompt_token_ids": [5, 6, 7]}
    bad, ok = llm.generate([engine_input(0), text], PROMPT_LOGPROBS, use_tqdm=False)
    assert bad.outputs[0].finish_reason == "error"
    assert f"max_encoder_patches={patches - 1}" in bad.error and f"{patches} ViT patches" in bad.error
    assert ok.outputs[0].finish_reason != "error" and len(ok.outputs[0].token_ids) == 1
