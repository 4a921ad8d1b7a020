"""The V4 decoder block (attention + MoE, each wrapped in mHC) and the MTP block built on it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer_core.models.deepseek_v4.addressing import StepAddressing
from deepinfer_core.models.deepseek_v4.attention import Attention, Pools
from deepinfer_core.models.deepseek_v4.config import MOE, SLIDING, DeepseekV4Config
from deepinfer_core.models.deepseek_v4.moe import MoE
from deepinfer_core.models.deepseek_v4.params import Module, Slot
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.mhc import HCParams


class Block(Module):
    """``h [T, N, D]`` streams -> mHC collapse -> norm -> attention -> mHC expand/mix; same again for the MoE."""

    def __init__(
        self, cfg: DeepseekV4Config, kind: str, ratio: int, mlp_type: str, name: str, dtype: torch.dtype
    ):
        self.cfg = cfg
        self.attn = Attention(cfg, kind, ratio, f"{name}.attn", dtype)
        self.ffn = MoE(cfg, mlp_type)
        self.attn_norm = Slot("attn_norm.weight", (cfg.hidden_size,), "float32")
        self.ffn_norm = Slot("ffn_norm.weight", (cfg.hidden_size,), "float32")
        n, d = cfg.hc_mult, cfg.hidden_size
        for site in ("hc_attn", "hc_ffn"):  # mHC parameters: fn [(2+N)*N, N*D], base [(2+N)*N], scale [3]
            setattr(self, f"{site}_fn", Slot(f"{site}_fn", ((2 + n) * n, n * d), "float32"))
            setattr(self, f"{site}_base", Slot(f"{site}_base", ((2 + n) * n,), "float32"))
            setattr(self, f"{site}_scale", Slot(f"{site}_scale", (3,), "float32"))
        self.hc: dict[str, HCParams] = {}  # each site's parameters as one object, once loaded

    def post_load(self) -> None:
        self.hc = {site: hc_params(self, site, self.cfg) for site in ("hc_attn", "hc_ffn")}

    def sublayers(
        self, input_ids: torch.Tensor, addr: StepAddressing, pools: Pools, ops: Backends
    ) -> list[Sublayer]:
        """Attention, then the MoE, each wrapped in mHC (its parameters and its norm)."""
        return [
            Sublayer(self, "hc_attn", self.attn_norm, lambda x: self.attn.forward(x, addr, pools, ops)),
            Sublayer(self, "hc_ffn", self.ffn_norm, lambda x: self.ffn.forward(x, input_ids, ops)),
        ]

    def forward(
        self, h: torch.Tensor, input_ids: torch.Tensor, addr: StepAddressing, pools: Pools, ops: Backends
    ) -> torch.Tensor:
        return run_sublayers(h, self.sublayers(input_ids, addr, pools, ops), ops)


class Sublayer:
    """One mHC-wrapped sublayer: its block's ``{site}_fn/base/scale``, its norm and its body ``x -> y``."""

    def __init__(self, block: Block, site: str, norm: Slot, body: Callable[[torch.Tensor], torch.Tensor]):
        self.hc, self.norm, self.body = block.hc[site], norm, body


def hc_params(module: Module, site: str, cfg: DeepseekV4Config) -> HCParams:
    """The loaded ``{site}_fn``, ``_base`` and ``_scale`` slots of ``module`` with V4's mixing constants."""
    fn, base, scale = (getattr(module, f"{site}_{k}").value for k in ("fn", "base", "scale"))
    return HCParams(fn, base, scale, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)


def run_sublayers(h: torch.Tensor, subs: list[Sublayer], ops: Backends) -> torch.Tensor:
    """Streams ``h [T, N, D]`` through a chain of sublayers: ``hc_pre`` + norm -> body -> ``hc_post`` each,
    where one sublayer's ``hc_post`` and the next one's entry are one fused step (``hc_post_pre``)."""
    fused = ops.fused
    x, post, comb = fused.hc_pre_norm(h, subs[0].hc, subs[0].norm.value)
    for sub, nxt in zip(subs, [*subs[1:], None]):
        y = sub.body(x)
        if nxt is None:
            return ops.dense.hc_post(y, h, post, comb)
        h, x, post, comb = fused.hc_post_pre(y, h, post, comb, nxt.hc, nxt.norm.value)
    raise ValueError("run_sublayers needs at least one sublayer")


class MTPBlock(Block):
    """DeepSeek's MTP module ``mtp.{i}``: a sliding-window block fed with
    ``e_proj(enorm(embed(next_token))) + h_proj(hnorm(prev_streams))``; its own ``hc_head`` and ``norm``
    produce the draft hidden, the main model's ``head`` the draft logits."""

    def __init__(self, cfg: DeepseekV4Config, index: int, dtype: torch.dtype):
        super().__init__(cfg, SLIDING, 0, MOE, f"mtp.{index}", dtype)
        d, n = cfg.hidden_size, cfg.hc_mult
        self.e_proj = Slot("e_proj.weight", (d, d), "linear")
        self.h_proj = Slot("h_proj.weight", (d, d), "linear")
        self.enorm = Slot("enorm.weight", (d,), "float32")
        self.hnorm = Slot("hnorm.weight", (d,), "float32")
        self.norm = Slot("norm.weight", (d,), "float32")
        self.hc_head_fn = Slot("hc_head_fn", (n, n * d), "float32")
        self.hc_head_base = Slot("hc_head_base", (n,), "float32")
        self.hc_head_scale = Slot("hc_head_scale", (1,), "float32")
        self.head_hc: HCParams | None = None

    def post_load(self) -> None:
        super().post_load()
        self.head_hc = hc_params(self, "hc_head", self.cfg)

    def embed_streams(self, emb: torch.Tensor, prev: torch.Tensor, ops: Backends) -> torch.Tensor:
        """``emb [T, D]`` (embedded next tokens), ``prev [T, N, D]`` (main streams) -> block input ``[T, N, D]``."""
        cfg, dense = self.cfg, ops.dense
        t, n, d = prev.shape
        e = dense.linear(dense.rms_norm(emb, self.enorm.value, cfg.rms_norm_eps), self.e_proj.value)
        hn = dense.rms_norm(prev, self.hnorm.value, cfg.rms_norm_eps).reshape(t * n, d)
        return e[:, None, :] + dense.linear(hn, self.h_proj.value).view(t, n, d)
