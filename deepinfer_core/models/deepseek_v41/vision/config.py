"""The vision settings of a V4.1 checkpoint: the ViT, the aligner, and the image-size rules."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

#: the released ``vision_*`` keys of ``inference/config.json``, and their HF-style names in a ``vision_config``
_HF_NAMES = {
    "num_hidden_layers": "n_layers",
    "hidden_size": "dim",
    "num_attention_heads": "n_heads",
    "intermediate_size": "inter_dim",
    "max_image_tokens": "max_n_token",
}


@dataclass(frozen=True)
class VisionConfig:
    """Field names drop the reference's ``vision_`` prefix; ``out_dim`` is the text model's ``dim``.

    Defaults are the reference's ``ModelArgs`` defaults (a checkpoint's config overrides them).
    ``norm_eps`` is fixed by the reference (its vision RMSNorm default), not read from a config."""

    n_layers: int = 32
    dim: int = 1024
    n_heads: int = 16
    inter_dim: int = 2816
    patch_size: int = 14
    rope_theta: float = 10000.0
    downsample_ratio: int = 3
    max_n_token: int = 1024
    min_pixels: int = 544 * 544
    max_wh_ratio: float | None = None
    out_dim: int = 5120
    image_token_id: int = 129264
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        head_dim, rem = divmod(self.dim, self.n_heads)
        if rem or head_dim % 4:
            raise ValueError(f"vision_dim {self.dim} must split into heads whose size is a multiple of 4")
        if self.max_n_token < 4:
            raise ValueError(
                f"vision_max_n_token {self.max_n_token} is below the 4 tokens of a one-cell image"
            )
        if self.patch_size < 1 or self.downsample_ratio < 1:
            raise ValueError("vision_patch_size and vision_downsample_ratio must be positive")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def cell(self) -> int:
        """Pixels per side of one image token: ``patch_size * downsample_ratio``."""
        return self.patch_size * self.downsample_ratio

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> VisionConfig | None:
        """From a root ``config.json`` (``vision_config`` nested, HF names) or ``inference/config.json``
        (flat ``vision_*`` keys, text ``dim``). ``None`` when the checkpoint has no vision tower."""
        nested = config.get("vision_config")
        if nested:
            values = {_HF_NAMES.get(k, k.removeprefix("vision_")): v for k, v in nested.items()}
            text = config.get("text_config") or config
            out_dim = text.get("hidden_size", text.get("dim"))
        else:
            values = {k.removeprefix("vision_"): v for k, v in config.items() if k.startswith("vision_")}
            out_dim = config.get("dim", config.get("hidden_size"))
        if not values.get("n_layers"):
            return None
        if out_dim is not None:
            values["out_dim"] = out_dim
        if "image_token_id" in config:
            values["image_token_id"] = config["image_token_id"]
        known = {f.name for f in fields(cls)} - {"norm_eps"}
        return cls(**{k: v for k, v in values.items() if k in known})
