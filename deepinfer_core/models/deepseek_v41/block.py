"""The V4.1 block: optional Engram injection, then attention and MoE, each between single-pass mHC sites
(``docs/v41_reference.md``, 3.2, 3.3 and 3.6).

Single pass: a site computes ``pre``, ``post`` and ``comb`` from the streams entering it; its ``post`` and
``comb`` expand its own output, and its ``pre`` collapses the streams for the *next* site. So attention reads
the streams collapsed by the previous block's FFN ``pre`` (a one-hot on stream 0 before the first block), and
the FFN reads them collapsed by this block's attention ``pre``. A block hands the next its FFN output unfolded
(:class:`Exit`): the next block's entry folds it into the streams in the same step as its coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_core.models.deepseek_v4.addressing import StepAddressing
from deepinfer_core.models.deepseek_v4.params import Module
from deepinfer_core.models.deepseek_v41.attention import Attention, Pools, Shared
from deepinfer_core.models.deepseek_v41.config import DeepseekV41Config
from deepinfer_core.models.deepseek_v41.engram_tier import PendingRows
from deepinfer_core.models.deepseek_v41.roles import LayerRole
from deepinfer_core.models.deepseek_v41.weights import StoredSlot, bf16, f32, fp8
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.mhc import HCParams
from deepinfer_core.ops.weights import ExpertWeights


class Expert(Module):
    """SwiGLU ``w2(silu(min(w1 x, limit)) * clamp(w3 x, +-limit))``: FP4 routed experts, the FP8 shared one."""

    def __init__(self, hidden: int, inter: int, stored: str):
        self.w1 = StoredSlot("w1.weight", (inter, hidden), stored)
        self.w2 = StoredSlot("w2.weight", (hidden, inter), stored)
        self.w3 = StoredSlot("w3.weight", (inter, hidden), stored)


class MoE(Module):
    """``sqrt(softplus(x gate^T)) / gate_temp`` scores; experts chosen by top-k of scores + bias (noaux_tc), weighted
    by the normalised unbiased scores times ``routed_scaling_factor``; plus one shared expert."""

    def __init__(self, cfg: DeepseekV41Config, n_routed: int | None = None, top_k: int | None = None):
        """``n_routed`` / ``top_k``: a DSpark stage's own expert counts (default: the backbone's)."""
        self.cfg = cfg
        e, d, inter = n_routed or cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.top_k = top_k or cfg.num_experts_per_tok
        self.gate = bf16("gate.weight", e, d)
        self.bias = f32("gate.bias", e)
        #: a vision checkpoint's bias for image-span positions (selection only, like ``bias``)
        self.bias_vl = f32("gate.bias_vl", e) if cfg.vision is not None else None
        self.experts = [Expert(d, inter, "fp4") for _ in range(e)]
        self.shared_experts = Expert(d, inter, "fp8")
        self.routed: ExpertWeights | None = None

    def post_load(self) -> None:
        """The routed experts this rank loaded (all of them without expert parallelism), by expert id."""
        held = [i for i, x in enumerate(self.experts) if x.w1.value is not None]
        ex = [self.experts[i] for i in held]
        self.routed = ExpertWeights(
            [x.w1.value for x in ex], [x.w3.value for x in ex], [x.w2.value for x in ex], held
        )

    def forward(self, x: torch.Tensor, ops: Backends, image_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``image_mask [T]`` (a step with image positions): those rows pick experts with ``bias_vl``."""
        c = self.cfg
        logits = ops.fused.linear_f32(x, self.gate.value)
        if c.gate_temp != 1.0:
            logits = logits / c.gate_temp
        weights, ids = self._route(logits, self.bias.value, ops)
        if image_mask is not None and self.bias_vl is not None:
            w_vl, ids_vl = self._route(logits, self.bias_vl.value, ops)
            weights = torch.where(image_mask[:, None], w_vl, weights)
            ids = torch.where(image_mask[:, None], ids_vl, ids)
        # DeepSeek normalises the weights only above top-1 (a DSpark stage may route top-1)
        if self.top_k == 1:
            weights = torch.nn.functional.softplus(logits.gather(1, ids)).sqrt() * c.routed_scaling_factor
        routed = ops.moe.experts(x, ids, weights, self.routed, c.swiglu_limit)
        s = self.shared_experts
        return ops.fused.swiglu_mlp_add(x, s.w1.value, s.w3.value, s.w2.value, c.swiglu_limit, routed)

    def _route(
        self, logits: torch.Tensor, bias: torch.Tensor, ops: Backends
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.moe.route_topk(logits, bias, self.top_k, "sqrtsoftplus", self.cfg.routed_scaling_factor)


class Engram(Module):
    """Gated injection of hashed n-gram rows: ``kv = wkv(rows)`` gives a key per stream and one shared value."""

    def __init__(self, cfg: DeepseekV41Config, index: int):
        e = cfg.engram
        self.cfg, self.index = cfg, index  # index: this layer's rank among the Engram layers
        d, hc = cfg.hidden_size, cfg.hc_mult
        self.embed = StoredSlot("embed.weight", (e.num_embeddings[index], e.head_dim), "rows8")
        self.wkv = fp8("wkv.weight", d * (hc + 1), e.n_cols * e.head_dim)
        self.q_weight = bf16("q_weight", hc, d)
        self.k_weight = bf16("k_weight", hc, d)

    def post_load(self) -> None:
        self.weight = self.q_weight.value.float() * self.k_weight.value.float()  # used only as a product

    def fetch(self, hash_ids: torch.Tensor) -> PendingRows:
        """Start reading this layer's table rows ``hash_ids [T, engram layers, cols]`` (the memory-mapped
        table, :mod:`.engram_tier`); FP8 rows times a ue8m0 scale per 32 once they are waited for."""
        return self.embed.value.fetch(hash_ids[:, self.index])

    def forward(self, h: torch.Tensor, rows: torch.Tensor, ops: Backends) -> torch.Tensor:
        """``h [T, hc, D]`` streams, ``rows [T, cols, head_dim]`` this layer's fetched rows -> ``[T, hc, D]``."""
        t, hc, d = h.shape
        kv = ops.dense.linear(rows.flatten(-2), self.wkv.value)
        key, value = kv[:, : hc * d].reshape(t, hc, d), kv[:, hc * d :]
        return ops.dense.engram_gate(h, key, value, self.weight, self.cfg.rms_norm_eps)


class EngramRows:
    """A step's Engram rows, fetched for every Engram layer when the step starts (so each layer's read overlaps
    the layers before it), or already read (a static step's); ``select``: the step rows the blocks now run on
    (bounded replay's tail)."""

    def __init__(self, pending: list[PendingRows] | list[torch.Tensor]):
        self.pending, self.select = pending, None

    def rows(self, index: int, dtype: torch.dtype) -> torch.Tensor:
        """Engram layer ``index``'s rows ``[T, cols, head_dim]`` (waits for its read)."""
        got = self.pending[index]
        rows = got if isinstance(got, torch.Tensor) else got.wait(dtype)
        return rows if self.select is None else rows[self.select]


@dataclass
class Exit:
    """A block's FFN output ``y [T, D]`` not yet folded into its streams ``residual [T, hc, D]`` (the site's
    ``post``, ``comb``): the next block's entry folds it in the same step as its own coefficients
    (``hc_post_site_norm``, one launch a layer fewer than ``hc_post`` then ``hc_site_norm``); :func:`streams`
    folds it alone."""

    y: torch.Tensor
    residual: torch.Tensor
    post: torch.Tensor
    comb: torch.Tensor

    @property
    def rows(self) -> int:
        return self.y.shape[0]


def streams(h: torch.Tensor | Exit, ops: Backends) -> torch.Tensor:
    """The streams ``[T, hc, D]``: ``h`` itself, or an :class:`Exit` folded in (``hc_post``)."""
    return ops.dense.hc_post(h.y, h.residual, h.post, h.comb) if isinstance(h, Exit) else h


class Block(Module):
    def __init__(
        self,
        cfg: DeepseekV41Config,
        role: LayerRole,
        readers: tuple[int, ...],
        dtype: torch.dtype,
        decoder: bool = False,
    ):
        self.cfg = cfg
        self.attn = Attention(cfg, role, readers, dtype, decoder)
        self.ffn = MoE(cfg)
        e = cfg.engram
        self.engram = Engram(cfg, e.layer_ids.index(role.layer)) if e and role.layer in e.layer_ids else None
        self.attn_norm = bf16("attn_norm.weight", cfg.hidden_size)
        self.ffn_norm = bf16("ffn_norm.weight", cfg.hidden_size)
        n, d = cfg.hc_mult, cfg.hidden_size
        for site in ("hc_attn", "hc_ffn"):
            setattr(self, f"{site}_fn", f32(f"{site}_fn", (2 + n) * n, n * d))
            setattr(self, f"{site}_base", f32(f"{site}_base", (2 + n) * n))
            setattr(self, f"{site}_scale", f32(f"{site}_scale", 3))
        self.hc: dict[str, HCParams] = {}

    def post_load(self) -> None:
        c = self.cfg
        self.hc = {
            site: HCParams(
                *(getattr(self, f"{site}_{k}").value for k in ("fn", "base", "scale")),
                c.hc_sinkhorn_iters,
                c.hc_eps,
                c.rms_norm_eps,
            )  # fmt: skip
            for site in ("hc_attn", "hc_ffn")
        }

    def forward(
        self,
        h: torch.Tensor | Exit,
        pre: torch.Tensor,
        engram: EngramRows | None,
        addr: StepAddressing,
        pools: Pools,
        ops: Backends,
        shared: Shared,
        tap: list[torch.Tensor] | None = None,
        image_mask: torch.Tensor | None = None,
    ) -> tuple[Exit, torch.Tensor]:
        """Streams ``h [T, hc, D]`` (or the block before's :class:`Exit`) and the previous site's ``pre [T, hc]``
        -> this block's :class:`Exit` (its FFN output, not yet folded into the streams) and its FFN site's
        ``pre`` (which collapses the next block's attention input). ``tap``: append the mean over the streams
        of the block's input (after Engram), what DSpark reads of a target layer. ``image_mask [T]``:
        image-span rows, which Engram passes through untouched and the router steers with ``bias_vl``."""
        if self.engram is not None:
            h = streams(h, ops)
            out = self.engram.forward(h, engram.rows(self.engram.index, h.dtype), ops)
            h = out if image_mask is None else torch.where(image_mask[:, None, None], h, out)
        # each site: its coefficients of the streams, and its input collapsed by the site before's pre, normed
        # (the rms_norm's eps is hc.norm_eps, the config's rms_norm_eps); the block before's exit folded into
        # this block's entry, one step
        if isinstance(h, Exit):
            h, x, a_pre, post, comb = ops.fused.hc_post_site_norm(
                h.y, h.residual, h.post, h.comb, self.hc["hc_attn"], pre, self.attn_norm.value
            )
        else:
            x, a_pre, post, comb = ops.fused.hc_site_norm(h, self.hc["hc_attn"], pre, self.attn_norm.value)
        if tap is not None:
            tap.append(h.mean(dim=1))
        y = self.attn.forward(x, addr, pools, ops, shared)
        h, x, f_pre, post, comb = ops.fused.hc_post_site_norm(
            y, h, post, comb, self.hc["hc_ffn"], a_pre, self.ffn_norm.value
        )
        return Exit(self.ffn.forward(x, ops, image_mask), h, post, comb), f_pre
