"""The V4.1 vision tower: a ViT over each image's patches, the 3x3 aligner into the text width, the span.

Every GEMM, norm, RoPE and attention goes through the platform ops (``backends.dense`` /
``backends.attention``); what stays here is bias adds, the exact-erf GELU, and reshapes.

- **ViT** (``vision.*``): ``patch_embed.proj`` (bias) maps a flattened ``[3, p, p]`` patch to ``dim``. Each
  block is pre-norm: ``x += wo(attn(rope(norm1(x))))``, ``x += mlp(norm2(x))``, then a final ``norm``.
  RMSNorms have eps 1e-6 and float32 scales. ``attn.wqkv`` and ``attn.wo`` have biases; attention is full and
  bidirectional within one image, scale ``head_dim ** -0.5``. ``mlp.w1`` is ``[gate; up]`` stacked
  (``2 * inter_dim`` rows, no bias), ``mlp.w2`` no bias: a SwiGLU without clamp.
- **2D RoPE** covers the whole head. A head's channels are halves ``(x1, x2)``; channel ``i`` of ``x1`` pairs
  with channel ``i`` of ``x2``. With ``f = theta ** -(arange(0, head_dim / 2, 2) / (head_dim / 2))``, pairs
  ``0 .. head_dim/4 - 1`` turn by ``row * f`` and the rest by ``col * f`` (the patch's place in its image).
  The loader permutes the q and k rows of ``wqkv`` so that each pair sits in adjacent channels, row pairs
  first (:func:`_interleave_rows`): the rotation is then two calls of the interleaved :meth:`DenseOps.rope`,
  and q.k is unchanged, since q and k move together.
- **Aligner** (``aligner.*``): the patch grid is zero-padded to multiples of ``r`` and each ``r x r`` block
  becomes one row, channel-major (``c * r * r + dy * r + dx``), in reading order; then ``w1`` (bias), GELU,
  ``w2`` (bias) into the text model's width.
- **Span**: the IMAGE positions take the aligner rows in order; START, NEW_LINE and END take the learned
  ``image_start``, ``image_newline``, ``image_end``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from deepinfer_core.models.deepseek_v41.vision.config import VisionConfig
from deepinfer_core.models.deepseek_v41.vision.image_processor import (
    IMAGE,
    IMAGE_END,
    IMAGE_NEW_LINE,
    IMAGE_START,
    ProcessedImage,
)
from deepinfer_core.ops.backends import Backends

DELIMITERS = {IMAGE_START: "image_start", IMAGE_NEW_LINE: "image_newline", IMAGE_END: "image_end"}


@dataclass
class VisionBlock:
    norm1: torch.Tensor
    wq: torch.Tensor  # the q rows of wqkv, interleaved for RoPE (see the module docstring)
    wk: torch.Tensor
    wv: torch.Tensor
    bq: torch.Tensor
    bk: torch.Tensor
    bv: torch.Tensor
    wo: torch.Tensor
    bo: torch.Tensor
    norm2: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


def _interleave_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Within each head, reorder rows ``[x1 | x2]`` to ``x1[0], x2[0], x1[1], x2[1], ...``."""
    rows = w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
    return rows.transpose(1, 2).reshape(w.shape)


def expected_shapes(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the published layout with its shape."""
    d, inter, out, r2 = cfg.dim, cfg.inter_dim, cfg.out_dim, cfg.downsample_ratio**2
    shapes: dict[str, tuple[int, ...]] = {
        "vision.patch_embed.proj.weight": (d, 3 * cfg.patch_size**2),
        "vision.patch_embed.proj.bias": (d,),
        "vision.norm.weight": (d,),
        "aligner.w1.weight": (out, d * r2),
        "aligner.w1.bias": (out,),
        "aligner.w2.weight": (out, out),
        "aligner.w2.bias": (out,),
        **{name: (out,) for name in DELIMITERS.values()},
    }
    for i in range(cfg.n_layers):
        b = f"vision.blocks.{i}."
        shapes |= {
            b + "norm1.weight": (d,),
            b + "attn.wqkv.weight": (3 * d, d),
            b + "attn.wqkv.bias": (3 * d,),
            b + "attn.wo.weight": (d, d),
            b + "attn.wo.bias": (d,),
            b + "norm2.weight": (d,),
            b + "mlp.w1.weight": (2 * inter, d),
            b + "mlp.w2.weight": (d, inter),
        }
    return shapes


class VisionTower:
    """Holds the tower's weights (``dtype``, norm scales float32) and encodes images with the platform ops."""

    def __init__(self, cfg: VisionConfig, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> None:
        check_tensors(cfg, tensors)
        self.cfg, self.dtype = cfg, dtype
        w = {k: v.to(torch.float32 if k.endswith("norm.weight") or "norm1" in k or "norm2" in k else dtype)
             for k, v in tensors.items()}  # fmt: skip
        self.patch_w, self.patch_b = w["vision.patch_embed.proj.weight"], w["vision.patch_embed.proj.bias"]
        self.blocks = [self._block(w, f"vision.blocks.{i}.") for i in range(cfg.n_layers)]
        self.norm = w["vision.norm.weight"]
        self.w1, self.b1 = w["aligner.w1.weight"], w["aligner.w1.bias"]
        self.w2, self.b2 = w["aligner.w2.weight"], w["aligner.w2.bias"]
        self.delimiters = {t: w[name] for t, name in DELIMITERS.items()}
        half = cfg.head_dim // 2
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half))

    def _block(self, w: dict[str, torch.Tensor], b: str) -> VisionBlock:
        wq, wk, wv = w[b + "attn.wqkv.weight"].chunk(3)
        bq, bk, bv = w[b + "attn.wqkv.bias"].chunk(3)
        gate, up = w[b + "mlp.w1.weight"].chunk(2)
        h = self.cfg.n_heads
        return VisionBlock(
            w[b + "norm1.weight"], _interleave_rows(wq, h), _interleave_rows(wk, h), wv,
            _interleave_rows(bq, h), _interleave_rows(bk, h), bv, w[b + "attn.wo.weight"],
            w[b + "attn.wo.bias"], w[b + "norm2.weight"], gate.contiguous(), up.contiguous(),
            w[b + "mlp.w2.weight"],
        )  # fmt: skip

    def to(self, device: torch.device | str) -> VisionTower:
        """Move every weight to ``device`` (in place); returns ``self``."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        for block in self.blocks:
            for name, value in vars(block).items():
                setattr(block, name, value.to(device))
        self.delimiters = {t: v.to(device) for t, v in self.delimiters.items()}
        return self

    def vit(
        self, backends: Backends, grids: Sequence[tuple[int, int]], patches: torch.Tensor
    ) -> torch.Tensor:
        """Patches of several images packed in order (``[sum(h * w), 3, p, p]``, grids ``(h, w)`` each)
        -> the ViT's output rows ``[sum(h * w), dim]``; each image attends only to itself."""
        dense, attention = backends.dense, backends.attention
        x = dense.linear(patches.flatten(1).to(self.dtype), self.patch_w) + self.patch_b
        rows, cols, cu = _positions(grids, x.device)
        scale = self.cfg.head_dim**-0.5
        for blk in self.blocks:
            h = dense.rms_norm(x, blk.norm1, self.cfg.norm_eps)
            q = self._rope(backends, self._heads(dense.linear(h, blk.wq) + blk.bq), rows, cols)
            k = self._rope(backends, self._heads(dense.linear(h, blk.wk) + blk.bk), rows, cols)
            v = self._heads(dense.linear(h, blk.wv) + blk.bv)
            o = attention.encoder_attention(q, k, v, cu, scale)
            x = x + dense.linear(o.flatten(1), blk.wo) + blk.bo
            h = dense.rms_norm(x, blk.norm2, self.cfg.norm_eps)
            x = backends.fused.swiglu_mlp_add(h, blk.gate, blk.up, blk.down, 0.0, x)  # x + the MLP
        return dense.rms_norm(x, self.norm, self.cfg.norm_eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.cfg.n_heads, self.cfg.head_dim)

    def _rope(
        self, backends: Backends, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
    ) -> torch.Tensor:
        half = self.cfg.head_dim // 2
        inv_freq = self.inv_freq.to(x.device)
        by_row = backends.dense.rope(x[..., :half].contiguous(), rows, inv_freq)
        by_col = backends.dense.rope(x[..., half:].contiguous(), cols, inv_freq)
        return torch.cat([by_row, by_col], dim=-1)

    def aligner(self, backends: Backends, features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """One image's ViT rows ``[h * w, dim]`` -> its image-token embeddings ``[ceil(h/r) * ceil(w/r), out]``."""
        r, (h, w) = self.cfg.downsample_ratio, grid
        x = F.pad(features.view(h, w, -1), (0, 0, 0, -w % r, 0, -h % r))
        bh, bw = x.shape[0] // r, x.shape[1] // r
        x = x.view(bh, r, bw, r, -1).permute(0, 2, 4, 1, 3).reshape(bh * bw, -1)
        dense = backends.dense
        return dense.linear(F.gelu(dense.linear(x, self.w1) + self.b1), self.w2) + self.b2

    def encode(self, backends: Backends, images: Sequence[ProcessedImage]) -> list[torch.Tensor]:
        """Each image's span of embeddings, ``[plan.num_tokens, out_dim]``, the ViT run once for all of them."""
        if not images:
            return []
        device = self.patch_w.device
        grids = [(im.plan.n_vit_h, im.plan.n_vit_w) for im in images]
        feats = self.vit(backends, grids, torch.cat([im.patches for im in images]).to(device))
        spans, start = [], 0
        for im, grid in zip(images, grids):
            n = grid[0] * grid[1]
            spans.append(
                self._span(im.types.to(device), self.aligner(backends, feats[start : start + n], grid))
            )
            start += n
        return spans

    def _span(self, types: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        span = rows.new_empty(types.numel(), rows.shape[-1])
        span[types == IMAGE] = rows
        for kind, vector in self.delimiters.items():
            span[types == kind] = vector
        return span


def _positions(grids: Sequence[tuple[int, int]], device: torch.device):
    """Each packed patch's row and column in its own image, and the images' boundaries ``cu_seqlens``."""
    rows = torch.cat([torch.arange(h).repeat_interleave(w) for h, w in grids])
    cols = torch.cat([torch.arange(w).repeat(h) for h, w in grids])
    cu = torch.tensor([0] + [h * w for h, w in grids]).cumsum(0)
    return rows.to(device), cols.to(device), cu.to(device)


def check_tensors(cfg: VisionConfig, tensors: Mapping[str, torch.Tensor]) -> None:
    """Exactly the published names, with the shapes ``cfg`` implies; a clear error otherwise."""
    shapes = expected_shapes(cfg)
    missing = sorted(set(shapes) - set(tensors))
    extra = sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise ValueError(f"vision tower tensors: missing {missing[:6]}, unexpected {extra[:6]}")
    wrong = [
        f"{k} {tuple(tensors[k].shape)} != {s}" for k, s in shapes.items() if tuple(tensors[k].shape) != s
    ]
    if wrong:
        raise ValueError(f"vision tower tensors have the wrong shape: {wrong[:6]}")
