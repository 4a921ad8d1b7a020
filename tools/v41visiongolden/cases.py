"""What the vision goldens cover: preprocessing configs, image sizes, test images, the tiny tower.

Images are built from small seeded ``uint8`` sources that the golden file stores, enlarged with Pillow's
NEAREST resize where a case needs a large image (an exact integer mapping, so a test rebuilds the same
pixels). Sizes for the token-count goldens are pure arithmetic and span 1 to 60,000 pixels a side.
"""

from __future__ import annotations

import io
import math

import torch
from PIL import Image

#: preprocessing configs, in the reference's ``vision_*`` names. ``release`` is ``ModelArgs``' defaults
#: (the published README: at most 1,024 image tokens); ``capped`` is the 384-token / 147,456-pixel / 8:1
#: setting several public V4.1 deployments quote; ``tiny`` keeps the tower goldens small.
PREPROCESS = {
    "release": {
        "vision_patch_size": 14, "vision_downsample_ratio": 3, "vision_max_n_token": 1024,
        "vision_min_pixels": 544 * 544, "vision_max_wh_ratio": None,
    },
    "capped": {
        "vision_patch_size": 14, "vision_downsample_ratio": 3, "vision_max_n_token": 384,
        "vision_min_pixels": 147456, "vision_max_wh_ratio": 8,
    },
    "tiny": {
        "vision_patch_size": 14, "vision_downsample_ratio": 3, "vision_max_n_token": 40,
        "vision_min_pixels": 3000, "vision_max_wh_ratio": 6,
    },
}  # fmt: skip

#: the tiny tower (with the ``tiny`` preprocessing): 2 layers, width 64, 4 heads of 16, 3x3 merge into 48
TOWER = {
    "vision_n_layers": 2, "vision_dim": 64, "vision_n_heads": 4, "vision_inter_dim": 96,
    "vision_rope_theta": 10000.0, "dim": 48, **PREPROCESS["tiny"],
}  # fmt: skip
TOWER_SEED = 41

#: hand-picked (width, height) for the token counts: tiny, square, extreme aspect both ways, huge, and the
#: boundaries of the 8:1 clip and of the budget
EDGE_SIZES = [
    (1, 1), (1, 2), (2, 1), (13, 7), (14, 14), (41, 42), (42, 42), (43, 43), (544, 544), (545, 543),
    (1000, 1), (1, 1000), (60000, 1), (1, 60000), (60000, 60000), (8, 1), (9, 1), (80, 10), (81, 10),
    (79, 10), (4000, 500), (4001, 500), (3999, 500), (1920, 1080), (1080, 1920), (4032, 3024), (3024, 4032),
    (400, 1), (1, 400), (1344, 1344), (1345, 1344), (1302, 1302), (31, 30000), (30000, 31), (7, 100000),
    (100000, 7), (640, 480), (224, 224), (500, 20), (20, 500),
]  # fmt: skip


def random_sizes(seed: int, n: int) -> list[tuple[int, int]]:
    """``n`` sizes, each side log-uniform in [1, 40000]."""
    g = torch.Generator().manual_seed(seed)
    sides = torch.exp(torch.rand(n, 2, generator=g, dtype=torch.float64) * math.log(40000))
    return [(int(w), int(h)) for w, h in sides.clamp(min=1).tolist()]


def source(seed: int, width: int, height: int, channels: int = 3) -> torch.Tensor:
    """A seeded ``uint8 [height, width, channels]`` image: smooth gradients plus noise and a hard edge."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(height, dtype=torch.float32)[:, None, None]
    x = torch.arange(width, dtype=torch.float32)[None, :, None]
    phase = torch.rand(1, 1, channels, generator=g) * 6.28
    smooth = 127.5 + 100 * torch.sin(x / (3 + width / 5) + y / (2 + height / 7) + phase)
    noise = torch.randint(-25, 26, (height, width, channels), generator=g).float()
    edge = ((x > width / 3) & (y < height / 2)).float() * 60
    return (smooth + noise + edge).clamp(0, 255).round().to(torch.uint8)


#: pixel cases: (name, preprocessing, source seed and size, final size or None, mode, encoding)
#: ``final``: NEAREST-resize the source to this size first; ``mode``: convert the source to it first
PIXEL_CASES = [
    ("one_pixel", "release", (1, 1, 1), None, "RGB", "png"),
    ("tiny_5x3", "release", (2, 5, 3), None, "RGB", "png"),
    ("small_40x30", "capped", (3, 40, 30), None, "RGB", "png"),
    ("photo_640x480", "release", (4, 64, 48), (640, 480), "RGB", "png"),
    ("photo_640x480_capped", "capped", (4, 64, 48), (640, 480), "RGB", "png"),
    ("big_3000x2000", "release", (5, 60, 40), (3000, 2000), "RGB", "png"),
    ("big_3000x2000_capped", "capped", (5, 60, 40), (3000, 2000), "RGB", "png"),
    ("portrait_700x1500", "capped", (6, 35, 75), (700, 1500), "RGB", "png"),
    ("wide_2000x9", "release", (7, 200, 9), (2000, 9), "RGB", "png"),
    ("wide_2000x9_stretched", "capped", (7, 200, 9), (2000, 9), "RGB", "png"),
    ("wide_exactly_8to1", "capped", (8, 80, 10), (800, 100), "RGB", "png"),
    ("wide_just_under_8to1", "capped", (8, 80, 10), (799, 100), "RGB", "png"),
    ("tall_9x2000", "capped", (9, 9, 200), (9, 2000), "RGB", "png"),
    ("extreme_100000x1", "release", (10, 1000, 1), (100000, 1), "RGB", "png"),
    ("extreme_1x30000", "release", (11, 1, 300), (1, 30000), "RGB", "png"),
    ("rgba_300x200", "capped", (12, 30, 20, 4), (300, 200), "RGBA", "png"),
    ("grey_333x111", "release", (13, 333, 111, 1), None, "L", "png"),
    ("palette_120x90", "capped", (14, 120, 90), None, "P", "png"),
    ("jpeg_320x240", "capped", (15, 32, 24), (320, 240), "RGB", "jpeg"),
    ("gif_77x55", "release", (16, 77, 55), None, "P", "gif"),
]


def build_image(case: tuple, sources: dict[str, torch.Tensor]) -> Image.Image:
    """The PIL image of a pixel case, from its stored source."""
    name, _, _, final, mode, _ = case
    src = sources[f"source.{name}"]
    channels = {1: "L", 3: "RGB", 4: "RGBA"}[src.shape[2]]
    image = Image.frombytes(channels, (src.shape[1], src.shape[0]), src.numpy().tobytes())
    if final is not None:
        image = image.resize(final, Image.Resampling.NEAREST)
    if mode != image.mode:
        image = image.convert(mode)
    return image


def encode(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt.upper(), **({"quality": 90} if fmt == "jpeg" else {}))
    return buf.getvalue()


#: tower cases: (name, source seed and size, final size or None); all with the ``tiny`` preprocessing
TOWER_CASES = [
    ("cell_1x1", (21, 20, 20), None),
    ("grid_wide", (22, 90, 40), (300, 130)),
    ("grid_tall", (23, 30, 70), (150, 333)),
    ("grid_square_odd", (24, 50, 50), (222, 220)),
    ("stretched_7to1", (25, 70, 10), (700, 100)),
]


def tower_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random vision weights in the published layout: linears and delimiters BF16, norm scales F32."""
    g = torch.Generator().manual_seed(seed)
    d, inter, out = cfg["vision_dim"], cfg["vision_inter_dim"], cfg["dim"]
    p2, r2 = 3 * cfg["vision_patch_size"] ** 2, cfg["vision_downsample_ratio"] ** 2

    def mat(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g) / math.sqrt(cols)).to(torch.bfloat16)

    def vec(n: int, scale: float = 0.1, mean: float = 0.0, dtype=torch.bfloat16) -> torch.Tensor:
        return (mean + scale * torch.randn(n, generator=g)).to(dtype)

    w = {"vision.patch_embed.proj.weight": mat(d, p2), "vision.patch_embed.proj.bias": vec(d)}
    for i in range(cfg["vision_n_layers"]):
        b = f"vision.blocks.{i}."
        w[b + "norm1.weight"] = vec(d, 0.2, 1.0, torch.float32)
        w[b + "attn.wqkv.weight"], w[b + "attn.wqkv.bias"] = mat(3 * d, d) * 2, vec(3 * d)
        w[b + "attn.wo.weight"], w[b + "attn.wo.bias"] = mat(d, d), vec(d)
        w[b + "norm2.weight"] = vec(d, 0.2, 1.0, torch.float32)
        w[b + "mlp.w1.weight"], w[b + "mlp.w2.weight"] = mat(2 * inter, d), mat(d, inter)
    w["vision.norm.weight"] = vec(d, 0.2, 1.0, torch.float32)
    w["aligner.w1.weight"], w["aligner.w1.bias"] = mat(out, d * r2), vec(out)
    w["aligner.w2.weight"], w["aligner.w2.bias"] = mat(out, out), vec(out)
    for name in ("image_start", "image_end", "image_newline"):
        w[name] = vec(out, 1.0)
    return w
