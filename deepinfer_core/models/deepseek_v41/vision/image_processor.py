"""Image bytes or a PIL image -> the ViT's patches and the image's span of prompt tokens (V4.1).

The rules are DeepSeek's (``inference/image_processor.py`` of the release; ``docs/vision.md`` states them):

1. **Plan** (:func:`plan_image`, arithmetic only). Start from the image's ``(w, h)``. A width above
   ``max_wh_ratio * h`` is clipped to it (only the width: tall images are never clipped). An image with
   ``0 < w * h < min_pixels`` is scaled up by ``sqrt(min_pixels / (w * h))``, truncating each side. Each
   side is rounded *up* to whole patches. The token grid is ``ceil(patches / downsample_ratio)`` per side and
   costs ``rows * (cols + 1) + 2`` tokens; when that exceeds ``max_n_token`` the size is refitted
   (:func:`_refit`): the largest aspect-preserving grid under the budget, sides rounded *down* to patches.
2. **Pixels** (:func:`image_pixels`). Images at least ``max_wh_ratio`` times wider than tall are stretched
   to the planned size. Every other image is letterboxed: scaled to fit inside it keeping its aspect ratio
   (one side exact, the other rounded half to even), centred on a grey (127, 127, 127) canvas. Both resizes
   are Pillow's bicubic. Then ``(v / 255 - 0.5) / 0.5`` in float32, rounded to bfloat16, cut into
   ``patch_size`` squares in reading order: ``[n_vit_h * n_vit_w, 3, p, p]``.
3. **Span** (:func:`image_token_types`): ``START, (IMAGE * cols, NEW_LINE) * rows, END``. Every position
   carries ``image_token_id``; only the type tells them apart.

Decoding (:func:`decode_image`) is ours: a format allow-list, Pillow's decompression-bomb limit as an
error (its warning too), and a clear :class:`ImageInputError` for every bad input. Like DeepSeek's code,
it does not apply EXIF orientation, and transparency is dropped by ``convert("RGB")``.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from deepinfer_core.models.deepseek_v41.vision.config import VisionConfig

if TYPE_CHECKING:
    from PIL import Image

IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END = range(4)
#: the formats :func:`decode_image` accepts (Pillow's names)
SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
#: the letterbox canvas
PAD_COLOR = (127, 127, 127)


class ImageInputError(ValueError):
    """An image that cannot be used: undecodable, unsupported, empty or too large. The message says which."""


def _pil():
    """``PIL.Image``, imported when an image is first handled: Pillow is the ``vision`` extra, so a core-only
    install runs V4.1 text checkpoints and says what to install when it is given an image."""
    try:
        from PIL import Image
    except ImportError:
        raise ImageInputError(
            'image input needs Pillow, which this install lacks: pip install "deepinfer-core[vision]"'
        ) from None
    return Image


@dataclass(frozen=True)
class ImagePlan:
    """Sizes for one image: the pixel size fed to the ViT, its patch grid and its token grid."""

    width: int
    height: int
    n_vit_h: int
    n_vit_w: int
    n_llm_h: int
    n_llm_w: int
    stretch: bool  # resize to (width, height) without keeping the aspect ratio

    @property
    def num_tokens(self) -> int:
        return num_image_tokens(self.n_llm_h, self.n_llm_w)


@dataclass(frozen=True)
class ProcessedImage:
    """``patches``: bfloat16 ``[n_vit_h * n_vit_w, 3, p, p]``; ``types``: int64 ``[plan.num_tokens]``."""

    plan: ImagePlan
    patches: torch.Tensor
    types: torch.Tensor


def num_image_tokens(n_llm_h: int, n_llm_w: int) -> int:
    """Span length: one token per cell, one NEW_LINE per row, START and END."""
    return n_llm_h * (n_llm_w + 1) + 2


def _token_grid(height: int, width: int, cfg: VisionConfig) -> tuple[int, int]:
    p, r = cfg.patch_size, cfg.downsample_ratio
    return math.ceil((height // p) / r), math.ceil((width // p) / r)


def _refit(height: float, width: float, cfg: VisionConfig) -> tuple[int, int]:
    """The largest ``(height, width)``, whole patches, whose token grid keeps the image within budget.

    ``cols`` solves ``rows * (cols + 1) + 2 = max_n_token`` with ``rows = cols * aspect``. Under one column
    (very tall) the image becomes one column of ``(max_n_token - 2) // 2`` cells; under one row (very wide)
    one row of ``max_n_token - 3`` cells. The float expressions keep the reference's order of operations,
    since the floors below turn a last-bit difference into a different size."""
    p, cell, budget = cfg.patch_size, cfg.cell, cfg.max_n_token
    aspect = height / width
    cols = math.sqrt((budget - 2) / aspect + 0.25) - 0.5
    rows = cols * aspect
    if cols < 1.0:
        return (budget - 2) // 2 * cell, cell
    if rows < 1.0:
        return cell, (budget - 3) * cell
    scale = min(math.floor(cols) * cell / width, math.floor(rows) * cell / height)
    return math.floor(height * scale / p) * p, math.floor(width * scale / p) * p


def plan_image(width: int, height: int, cfg: VisionConfig) -> ImagePlan:
    """The sizes for an image of ``width x height`` pixels (both positive)."""
    if width <= 0 or height <= 0:
        raise ImageInputError(f"image has no pixels: {width}x{height}")
    p, ratio = cfg.patch_size, cfg.max_wh_ratio
    w: float = width
    h: float = height
    if ratio is not None and w > h * ratio:
        w = h * ratio
    if w * h < cfg.min_pixels:
        grow = (cfg.min_pixels / (w * h)) ** 0.5
        w, h = int(w * grow), int(h * grow)
    best_h, best_w = math.ceil(h / p) * p, math.ceil(w / p) * p
    rows, cols = _token_grid(best_h, best_w, cfg)
    if num_image_tokens(rows, cols) > cfg.max_n_token:
        best_h, best_w = _refit(h, w, cfg)
        rows, cols = _token_grid(best_h, best_w, cfg)
    stretch = ratio is not None and width >= ratio * height
    return ImagePlan(best_w, best_h, best_h // p, best_w // p, rows, cols, stretch)


def _letterbox(image: Image.Image, width: int, height: int) -> Image.Image:
    Image = _pil()  # noqa: N806
    """Fit ``image`` inside ``width x height`` keeping its aspect ratio, centred on the grey canvas."""
    w, h = image.size
    size = (width, height)
    if w / h > width / height:
        size = (width, round(h / w * width))
    elif w / h < width / height:
        size = (round(w / h * height), height)
    if size == (width, height):
        return image.resize(size, Image.Resampling.BICUBIC)
    canvas = Image.new("RGB", (width, height), PAD_COLOR)
    if min(size) > 0:
        offset = (
            (round((width - size[0]) * 0.5), 0) if size[0] != width else (0, round((height - size[1]) * 0.5))
        )
        canvas.paste(image.resize(size, Image.Resampling.BICUBIC), offset)
    return canvas


def image_pixels(image: Image.Image, plan: ImagePlan) -> torch.Tensor:
    Image = _pil()  # noqa: N806
    """The resized RGB image as normalised bfloat16 ``[3, plan.height, plan.width]``."""
    if plan.stretch:
        resized = image.resize((plan.width, plan.height), Image.Resampling.BICUBIC)
    else:
        resized = _letterbox(image, plan.width, plan.height)
    raw = torch.frombuffer(bytearray(resized.tobytes()), dtype=torch.uint8)
    x = raw.view(plan.height, plan.width, 3).permute(2, 0, 1).float() / 255
    return ((x - 0.5) / 0.5).to(torch.bfloat16)


def patchify(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[3, H, W]`` -> ``[(H/p) * (W/p), 3, p, p]``, patches in reading order."""
    c, hh, ww = pixels.shape
    p = patch_size
    grid = pixels.reshape(c, hh // p, p, ww // p, p).permute(1, 3, 0, 2, 4)
    return grid.reshape(-1, c, p, p)


def image_token_types(n_llm_h: int, n_llm_w: int) -> torch.Tensor:
    """The span's token types, int64 ``[num_image_tokens(n_llm_h, n_llm_w)]``."""
    row = [IMAGE] * n_llm_w + [IMAGE_NEW_LINE]
    return torch.tensor([IMAGE_START] + row * n_llm_h + [IMAGE_END], dtype=torch.int64)


def _open(data: bytes, formats: tuple[str, ...] | None) -> Image.Image:
    Image = _pil()  # noqa: N806
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data), formats=formats)


def decode_image(data: bytes) -> Image.Image:
    """Decode image bytes into a loaded PIL image, or raise :class:`ImageInputError` saying why."""
    if not data:
        raise ImageInputError("image data is empty")
    Image = _pil()  # noqa: N806
    try:
        image = _open(data, SUPPORTED_FORMATS)
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageInputError(
            f"image is too large (decompression-bomb limit of {Image.MAX_IMAGE_PIXELS} pixels): {exc}"
        ) from None
    except Image.UnidentifiedImageError:
        raise ImageInputError(_unidentified(data)) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageInputError(f"corrupt image data: {exc}") from None
    return image


def _unidentified(data: bytes) -> str:
    """Name the format of data that no allowed decoder took, if Pillow knows it at all (header only)."""
    try:
        fmt = _open(data, None).format
    except Exception:  # noqa: BLE001 - anything here means "not an image we can name"
        fmt = None
    if fmt:
        return f"unsupported image format {fmt!r} (supported: {', '.join(SUPPORTED_FORMATS)})"
    return "corrupt image data: not a recognisable image"


def process_image(image: Image.Image | bytes, cfg: VisionConfig) -> ProcessedImage:
    """Bytes (decoded with :func:`decode_image`) or a PIL image -> patches and token types."""
    Image = _pil()  # noqa: N806
    if isinstance(image, bytes | bytearray | memoryview):
        image = decode_image(bytes(image))
    if not isinstance(image, Image.Image):
        raise ImageInputError(f"expected image bytes or a PIL.Image, got {type(image).__name__}")
    width, height = image.size
    if width * height > (Image.MAX_IMAGE_PIXELS or math.inf):
        raise ImageInputError(
            f"image is too large: {width}x{height} exceeds the decompression-bomb limit "
            f"of {Image.MAX_IMAGE_PIXELS} pixels"
        )
    plan = plan_image(width, height, cfg)
    pixels = image_pixels(image.convert("RGB"), plan)
    return ProcessedImage(
        plan, patchify(pixels, cfg.patch_size), image_token_types(plan.n_llm_h, plan.n_llm_w)
    )
