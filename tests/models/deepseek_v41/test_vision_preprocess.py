"""V4.1 image preprocessing against DeepSeek's ``image_processor.py`` (goldens in ``tests/data/v41_vision``,
written by ``tools/v41_vision_goldens.py``): token counts for 440 sizes under three configs, exactly; the
patches of 20 images bit for bit; and a clear error for every bad input."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import sys
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from deepinfer_core.models.deepseek_v41.vision.config import VisionConfig
from deepinfer_core.models.deepseek_v41.vision.image_processor import (
    IMAGE,
    IMAGE_END,
    IMAGE_NEW_LINE,
    IMAGE_START,
    ImageInputError,
    decode_image,
    plan_image,
    process_image,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "v41_vision"
sys.path.insert(0, str(DATA.parents[2] / "tools"))
from v41visiongolden import cases  # noqa: E402

COUNTS = json.loads((DATA / "token_counts.json").read_text())
PIXELS = json.loads((DATA / "pixels.json").read_text())["cases"]


def config(name: str) -> VisionConfig:
    return VisionConfig.from_dict({"vision_n_layers": 1, "dim": 8, **COUNTS["configs"][name]})


@pytest.mark.parametrize("name", sorted(COUNTS["sizes"]))
def test_token_counts_equal_the_oracles_for_every_size(name):
    cfg = config(name)
    got = []
    for w, h, *_ in COUNTS["sizes"][name]:
        plan = plan_image(w, h, cfg)
        got.append([w, h, plan.width, plan.height, plan.n_llm_h, plan.n_llm_w, plan.num_tokens])
    assert got == COUNTS["sizes"][name]
    assert max(row[-1] for row in got) <= cfg.max_n_token


def test_the_sizes_cover_budget_hits_and_misses():
    for name, rows in COUNTS["sizes"].items():
        budget = COUNTS["configs"][name]["vision_max_n_token"]
        tokens = [r[-1] for r in rows]
        assert min(tokens) < budget / 4 and max(tokens) > budget * 0.9, name


@pytest.mark.parametrize("case", cases.PIXEL_CASES, ids=[c[0] for c in cases.PIXEL_CASES])
def test_patches_equal_the_oracles_bit_for_bit(case, pixel_tensors):
    name, pre, *_ = case
    want = PIXELS[name]
    key = f"bytes.{name}"
    data = pixel_tensors[key].numpy().tobytes() if key in pixel_tensors else None
    if data is None:
        data = cases.encode(cases.build_image(case, pixel_tensors), case[5])
    out = process_image(data, config(pre))
    plan = out.plan
    assert [plan.n_vit_h, plan.n_vit_w, plan.n_llm_h, plan.n_llm_w] == want["grid"]
    assert list(out.patches.shape) == want["patches_shape"] and out.patches.dtype == torch.bfloat16
    if f"patches.{name}" in pixel_tensors:
        assert torch.equal(out.patches, pixel_tensors[f"patches.{name}"])
    digest = hashlib.sha256(out.patches.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    assert digest == want["patches_sha256"]


@pytest.fixture(scope="module")
def pixel_tensors():
    return load_file(DATA / "pixels.safetensors")


def test_a_pil_image_gives_the_same_patches_as_its_png_bytes(pixel_tensors):
    case = next(c for c in cases.PIXEL_CASES if c[0] == "rgba_300x200")
    image = cases.build_image(case, pixel_tensors)
    from_pil = process_image(image, config("capped"))
    from_bytes = process_image(cases.encode(image, "png"), config("capped"))
    assert torch.equal(from_pil.patches, from_bytes.patches)


def test_token_types_lay_out_the_grid_in_reading_order():
    out = process_image(Image.new("RGB", (300, 130), (10, 200, 30)), config("tiny"))
    rows, cols = out.plan.n_llm_h, out.plan.n_llm_w
    types = out.types.tolist()
    assert len(types) == out.plan.num_tokens == rows * (cols + 1) + 2
    assert types[0] == IMAGE_START and types[-1] == IMAGE_END
    assert types[1:-1] == ([IMAGE] * cols + [IMAGE_NEW_LINE]) * rows


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` (1-bit grey) with no real pixel data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )


def _encoded(fmt: str, size=(20, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "image data is empty"),
        (b"this is not an image at all", "corrupt image data"),
        (_encoded("PNG")[:40], "corrupt image data"),
        (_encoded("PNG")[:-30] + bytes(30), "corrupt image data"),
        (_encoded("PPM"), "unsupported image format 'PPM'"),
        (_encoded("TGA"), "unsupported image format 'TGA'"),
        (_png_header_only(30_000, 30_000), "decompression-bomb limit"),  # above 2x the limit: Pillow's error
        (_png_header_only(10_000, 10_000), "decompression-bomb limit"),  # above the limit: Pillow's warning
    ],
    ids=[
        "empty",
        "garbage",
        "truncated_header",
        "truncated_data",
        "ppm",
        "tga",
        "bomb_error",
        "bomb_warning",
    ],
)
def test_bad_image_bytes_raise_a_clear_error(data, message):
    with pytest.raises(ImageInputError, match=message):
        process_image(data, config("release"))


def test_a_zero_size_image_is_refused():
    for size in [(0, 0), (0, 5), (5, 0)]:
        with pytest.raises(ImageInputError, match=r"image has no pixels: \d+x\d+"):
            process_image(Image.new("RGB", size), config("release"))


def test_an_in_memory_image_over_the_bomb_limit_is_refused(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ImageInputError, match="exceeds the decompression-bomb limit of 1000 pixels"):
        process_image(Image.new("RGB", (50, 21)), config("release"))
    process_image(Image.new("RGB", (50, 20)), config("release"))


def test_something_else_than_an_image_is_refused():
    with pytest.raises(ImageInputError, match="expected image bytes or a PIL.Image, got str"):
        process_image("cat.png", config("release"))


def test_decode_image_accepts_every_supported_format():
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        assert decode_image(_encoded(fmt)).size == (20, 10)


def test_without_pillow_an_image_says_what_to_install(monkeypatch):
    """Pillow is the ``vision`` extra and is imported only when an image is handled: without it an image fails
    naming the extra to install. (That the V4.1 model imports and generates without Pillow is the core-only
    ``demo`` CI session: a fresh venv with ``pip install .`` runs ``deepinfer generate`` on the V4.1 demo.)"""
    data = cases.encode(Image.new("RGB", (40, 30), (1, 2, 3)), "png")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImageInputError, match=r'pip install "deepinfer-core\[vision\]"'):
        process_image(data, config("tiny"))
    with pytest.raises(ImageInputError, match="Pillow"):
        decode_image(data)
