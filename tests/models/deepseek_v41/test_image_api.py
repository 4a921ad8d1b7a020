"""Image input through the public API (V4.1 with a vision tower, reference backend, float32):

- ``generate`` with a text prompt holding the placeholder, or token ids, and ``multi_modal_data`` (one image
  or a list) gives the reference's prompt logprobs (``vl_goldens``);
- ``chat`` with ``image_url`` data-URL parts renders each image as a placeholder block (DeepSeek's encoding:
  an image block becomes a text block ``<｜deepseek_image｜>``) and gives what ``generate`` gives for that
  prompt and image; remote URLs and local paths are refused with a clear error;
- bad images fail alone with an error naming the problem (corrupt bytes, an unsupported format, 0x0, a
  decompression bomb, more image tokens than ``max_model_len``, placeholders and images that do not match,
  a placeholder without any image),
  while the other requests of the same call complete; an image on a checkpoint without a vision tower too.
"""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from deepinfer_core import LLM, SamplingParams
from tests.models.deepseek_v41.goldens import checkpoint
from tests.models.deepseek_v41.vl_goldens import (
    CHECKPOINT,
    engine_input,
    expanded_ids,
    goldens,
    image,
    logprob_diffs,
)

BOS, PLACEHOLDER = "<｜begin▁of▁sentence｜>", "<｜deepseek_image｜>"
TOL = 1e-4
PROMPT_LOGPROBS = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, logprobs=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(model=str(CHECKPOINT), dtype="float32", kv_cache_dtype="unquantized", block_size=8)


def _png(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _data_url(img: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(_png(img)).decode()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _bomb_png() -> bytes:
    """A PNG header that claims 20000 x 20000 pixels (Pillow's bomb check reads only the header)."""
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IEND", b"")


def test_text_prompt_with_a_placeholder_and_one_image_gives_the_reference_logprobs(llm):
    _, meta = goldens()
    before, _, after = meta["prompts"][0]["pieces"]
    prompt = {"prompt": f"{BOS}{before}{PLACEHOLDER}{after}", "multi_modal_data": {"image": image("a")}}
    out = llm.generate([prompt], PROMPT_LOGPROBS, use_tqdm=False)[0]
    assert out.prompt_token_ids == expanded_ids(0)
    assert float(logprob_diffs(0, out).max()) <= TOL


def test_chat_with_image_url_parts_renders_placeholder_blocks_and_reaches_the_model(llm):
    a, b = image("a"), image("b")
    content = [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": _data_url(a)}},
        {"type": "image_url", "image_url": _data_url(b)},
    ]
    text = f"{BOS}<｜User｜>Compare\n\n{PLACEHOLDER}\n\n{PLACEHOLDER}<｜Assistant｜></think>"
    chat = llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)[0]
    assert chat.prompt == text
    direct, swapped = llm.generate(
        [
            {"prompt": text, "multi_modal_data": {"image": [a, b]}},
            {"prompt": text, "multi_modal_data": {"image": [a, a.transpose(0)]}},
        ],
        GREEDY,
        use_tqdm=False,
    )
    assert chat.prompt_token_ids == direct.prompt_token_ids
    assert chat.outputs[0].logprobs == direct.outputs[0].logprobs
    assert chat.outputs[0].logprobs != swapped.outputs[0].logprobs  # the images reach the model


@pytest.mark.parametrize(
    "url, error",
    [
        ("https://example.com/cat.png", "remote image URLs are not fetched"),
        ("/tmp/cat.png", "only data: URLs are accepted, not local paths"),
        ("file:///tmp/cat.png", "only data: URLs are accepted"),
        ("data:image/png,rawbytes", "a data: URL must be base64"),
    ],
)
def test_chat_refuses_image_urls_that_are_not_inline_data(llm, url, error):
    content = [{"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(ValueError, match=error):
        llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)


def _bad_inputs() -> dict[str, tuple[dict, str]]:
    ids = engine_input(0)["prompt_token_ids"]

    def with_image(img) -> dict:
        return {"prompt_token_ids": ids, "multi_modal_data": {"image": img}}

    ppm = _png(image("a"), "PPM")
    return {
        "corrupt": (with_image(_png(image("a"))[:60]), "corrupt image data"),
        "format": (with_image(ppm), "unsupported image format 'PPM'"),
        "empty": (with_image(Image.new("RGB", (0, 0))), "image has no pixels: 0x0"),
        "bomb": (with_image(_bomb_png()), "image is too large"),
        "count": (
            with_image([image("a"), image("b")]),
            "1 image placeholder(s) (token id 384) but 2 image(s)",
        ),
        "long": (engine_input(1), "its 2 image(s) take 46 tokens"),
        "no image": ({"prompt_token_ids": ids}, "1 image placeholder(s) (token id 384) but 0 image(s)"),
    }


def test_bad_images_fail_alone_with_an_error_naming_the_problem():
    llm = LLM(
        model=str(CHECKPOINT), dtype="float32", kv_cache_dtype="unquantized", block_size=8, max_model_len=64
    )
    bad = _bad_inputs()
    good = engine_input(0)
    outs = llm.generate([good] + [p for p, _ in bad.values()] + [good], GREEDY, use_tqdm=False)
    for out in (outs[0], outs[-1]):
        assert out.error is None and out.outputs[0].finish_reason == "length"
        assert len(out.outputs[0].token_ids) == 3
    for out, (name, (_, error)) in zip(outs[1:-1], bad.items(), strict=True):
        assert out.outputs[0].finish_reason == "error", name
        assert error in out.error, (name, out.error)
    assert (
        llm.generate([good], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
    )


def test_an_image_for_a_checkpoint_without_a_vision_tower_fails_alone():
    llm = LLM(
        model=str(checkpoint("reindex_r2")), dtype="float32", kv_cache_dtype="unquantized", block_size=8
    )
    text = {"prompt_token_ids": [0, 5, 6, 7]}
    with_image = {"prompt_token_ids": [0, 5, 6, 7], "multi_modal_data": {"image": image("a")}}
    ok, failed = llm.generate([text, with_image], GREEDY, use_tqdm=False)
    assert ok.error is None and len(ok.outputs[0].token_ids) == 3
    assert failed.outputs[0].finish_reason == "error"
    assert "this checkpoint has no vision tower" in failed.error
