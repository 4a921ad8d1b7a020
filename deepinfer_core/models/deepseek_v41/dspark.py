"""DSpark, V4.1's block draft head: the stages ``mtp.0 .. mtp.{n-1}`` of the checkpoint (``docs/spec_decode.md``).

Context. The target's forward taps, for each of ``target_layer_ids``, the mean over the mHC streams of that
layer's input (after its Engram injection), concatenated: ``taps [T, D * len(targets)]``. Stage 0 projects them,
``main_x = main_norm(main_proj(taps))``, and *every* stage keeps its own window KV of ``main_x``,
``mtp.{i}.attn.swa_kv`` (``rope(kv_norm(wkv(main_x)))`` at the token's position, plain ``rope_theta``, no YaRN),
in the window group like the backbone's. :func:`write_context` writes it for every computed position.

A draft block. For a request whose last computed position is ``p`` and whose next token is ``y`` (at ``p + 1``),
the block is ``[y, noise, ..., noise]`` (``block_size`` tokens) at positions ``p + 1 .. p + block_size``. Its
rows enter ``hc_mult`` identical streams and run through every stage (a V4.1 block: single-pass mHC,
attention, MoE with the stage's own ``dspark_n_routed_experts`` / top-``dspark_n_activated_experts``). A
stage's attention is non-causal inside the block: every block row sees the stage's window KV of positions
``p - window + 1 .. p`` and all the block's rows (their KV computed in place, never stored). The last stage's
FFN ``pre`` collapses the streams to ``x [T, B, D]``; ``head(norm(x))`` gives slot ``i``'s base logits (the
draft of position ``p + 2 + i``). The Markov head adds ``head_m(embed_m(previous token))`` to slot ``i``, the
previous token being ``y`` for slot 0 and slot ``i - 1``'s draft after it, so drafting is sequential over the
slots (:func:`markov_bias`). The confidence head reads ``[x, embed_m(previous token)]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.deepseek_v4.attention import flat
from deepinfer_core.models.deepseek_v4.config import ModelConfigError
from deepinfer_core.models.deepseek_v4.params import Module
from deepinfer_core.models.deepseek_v41.attention import Attention, Pools, Shared, _spec
from deepinfer_core.models.deepseek_v41.block import Block, MoE, streams
from deepinfer_core.models.deepseek_v41.config import DeepseekV41Config
from deepinfer_core.models.deepseek_v41.roles import SWA, LayerRole
from deepinfer_core.models.deepseek_v41.weights import bf16, fp8
from deepinfer_core.ops.backends import Backends


@dataclass(frozen=True)
class DSparkConfig:
    num_stages: int
    block_size: int
    noise_token_id: int
    target_layer_ids: tuple[int, ...]
    markov_rank: int
    n_routed_experts: int
    n_activated_experts: int

    @classmethod
    def from_config(cls, cfg: DeepseekV41Config) -> DSparkConfig | None:
        """The ``dspark_*`` settings, checked; None when the config has no DSpark head."""
        d, n = cfg.dspark, cfg.num_nextn_predict_layers
        if not d.get("block_size") or n == 0:
            return None
        out = cls(
            num_stages=n,
            block_size=int(d["block_size"]),
            noise_token_id=int(d.get("noise_token_id", 0)),
            target_layer_ids=tuple(int(x) for x in d.get("target_layer_ids", ())),
            markov_rank=int(d.get("markov_rank", 256)),
            n_routed_experts=int(d.get("n_routed_experts") or cfg.n_routed_experts),
            n_activated_experts=int(d.get("n_activated_experts") or cfg.num_experts_per_tok),
        )
        layers = cfg.num_hidden_layers
        problems = [
            (out.block_size >= 1, f"dspark_block_size={out.block_size} must be >= 1"),
            (
                0 <= out.noise_token_id < cfg.vocab_size,
                f"dspark_noise_token_id={out.noise_token_id} not a token",
            ),
            (
                bool(out.target_layer_ids) and all(0 <= t < layers for t in out.target_layer_ids),
                f"dspark_target_layer_ids={list(out.target_layer_ids)} must name backbone layers (< {layers})",
            ),
            (
                out.n_activated_experts <= out.n_routed_experts,
                f"dspark_n_activated_experts={out.n_activated_experts} exceeds the stage's experts",
            ),
            (all(r == 0 for r in cfg.compress_ratios[layers:]), "DSpark stages must have compress ratio 0"),
        ]
        for ok, msg in problems:
            if not ok:
                raise ModelConfigError(f"config.json: {msg}")
        return out


@dataclass
class BlockAddressing:
    """The slots of a draft step's block rows (``T * B`` rows, request-major): ``positions`` ``p + 1 + i``,
    ``window_slots [T*B, W]`` (the window of ``p``, repeated per row) and ``block_rows [T*B, B]`` (the rows
    of the row's own block)."""

    positions: torch.Tensor
    window_slots: torch.Tensor
    block_rows: torch.Tensor

    @classmethod
    def build(cls, positions: torch.Tensor, window_slots: torch.Tensor, block: int) -> BlockAddressing:
        """From one row per request at its last computed position ``p`` (``positions [T]``) and the window
        slots of those rows."""
        offs = torch.arange(block, device=positions.device)
        t = positions.shape[0]
        rows = (torch.arange(t, device=positions.device) * block)[:, None] + offs[None, :]
        return cls(
            (positions[:, None] + 1 + offs[None, :]).flatten(),
            window_slots.repeat_interleave(block, dim=0),
            rows.repeat_interleave(block, dim=0),
        )


class DSparkAttention(Attention):
    """A stage's attention: the backbone's MQA with a learned sink, over the stage's window of the context and
    the draft block itself (no compressed KV)."""

    def __init__(self, cfg: DeepseekV41Config, role: LayerRole, index: int, dtype: torch.dtype):
        super().__init__(cfg, role, (), dtype)
        self.name = f"mtp.{index}.attn"

    def cache_specs(self) -> list[CacheSpec]:
        c = self.cfg
        return [
            _spec(f"{self.name}.swa_kv", "window", 1, c.head_dim, self.dtype, self.formats.window,
                  window=c.sliding_window - 1)
        ]  # fmt: skip

    def _kv(self, x: torch.Tensor, positions: torch.Tensor, ops: Backends) -> torch.Tensor:
        return self._normed_kv(ops.dense.linear(x, self.wkv.value), positions, ops)

    def _normed_kv(self, kv: torch.Tensor, positions: torch.Tensor, ops: Backends) -> torch.Tensor:
        """The window KV of the ``wkv`` projection ``kv [T, head_dim]``: normed, then rotated."""
        c, dense = self.cfg, ops.dense
        kv = dense.rms_norm(kv, self.kv_norm.value, c.rms_norm_eps)
        return dense.rope(kv.view(-1, 1, c.head_dim), positions, self.freq).view(-1, c.head_dim)

    def write_context(self, main_x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, pools: Pools,
                      ops: Backends) -> None:  # fmt: skip
        """The stage's window KV of the projected context ``main_x [T, D]`` at ``positions`` -> ``slots``."""
        pool = flat(pools[f"{self.name}.swa_kv"])
        ops.attention.store_kv(pool, slots, self._kv(main_x, positions, ops), self.formats.window)

    def forward(
        self, x: torch.Tensor, addr: BlockAddressing, pools: Pools, ops: Backends, shared: Shared
    ) -> torch.Tensor:
        """Block rows ``x [T*B, D]`` (normed) -> ``[T*B, D]``."""
        c, dense, pos = self.cfg, ops.dense, addr.positions
        t, h, d = x.shape[0], c.num_attention_heads, c.head_dim
        qr, kv = self.x_proj(x, ops)
        qr = dense.rms_norm(qr, self.q_norm.value, c.rms_norm_eps)
        q = dense.linear(qr, self.wq_b.value).view(t, h, d)  # rotated by the attention step
        block_kv = self._normed_kv(kv, pos, ops)
        fmt = self.formats.window
        if fmt is not None:  # the block's KV goes through the window format, as the reference rounds it
            block_kv = fmt.pack(block_kv)
        o = ops.fused.rope_sparse_attention_unrope(
            q, flat(pools[f"{self.name}.swa_kv"]), addr.window_slots, block_kv, addr.block_rows,
            self.attn_sink.value, d**-0.5, pos, self.freq, kv_format=fmt,
        )  # fmt: skip
        low = dense.grouped_linear(o.view(t, c.o_groups, h * d // c.o_groups), self.wo_groups)
        return dense.linear(low.flatten(1), self.wo_b.value)


class MarkovHead(Module):
    def __init__(self, vocab: int, rank: int):
        self.embed = bf16("embed.weight", vocab, rank)
        self.head = bf16("head.weight", vocab, rank)


class ConfidenceHead(Module):
    def __init__(self, width: int):
        self.proj = bf16("proj.weight", 1, width)


class DSparkStage(Block):
    """Stage ``mtp.{index}``: a V4.1 block (window-only attention, its own MoE); stage 0 also holds
    ``main_proj`` / ``main_norm``, the last stage ``norm``, the Markov head and the confidence head."""

    #: expert parallelism leaves a stage whole on every rank (its expert counts are not the backbone's)
    ep_sharded = False

    def __init__(self, cfg: DeepseekV41Config, ds: DSparkConfig, index: int, dtype: torch.dtype):
        role = LayerRole(cfg.num_hidden_layers + index, SWA, 0, -1, -1, False, False)
        super().__init__(cfg, role, (), dtype)
        d = cfg.hidden_size
        self.attn = DSparkAttention(cfg, role, index, dtype)
        self.ffn = MoE(cfg, ds.n_routed_experts, ds.n_activated_experts)
        if index == 0:
            self.main_proj = fp8("main_proj.weight", d, d * len(ds.target_layer_ids))
            self.main_norm = bf16("main_norm.weight", d)
        if index == ds.num_stages - 1:
            self.norm = bf16("norm.weight", d)
            self.markov_head = MarkovHead(cfg.vocab_size, ds.markov_rank)
            self.confidence_head = ConfidenceHead(d + ds.markov_rank)


def write_context(
    stages: list[DSparkStage], taps: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, pools: Pools,
    ops: Backends,
) -> None:  # fmt: skip
    """Every stage's window KV at ``positions`` from the target's taps ``[T, D * len(targets)]``."""
    s0, eps = stages[0], stages[0].cfg.rms_norm_eps
    main_x = ops.dense.rms_norm(ops.dense.linear(taps, s0.main_proj.value), s0.main_norm.value, eps)
    for stage in stages:
        stage.attn.write_context(main_x, positions, slots, pools, ops)


def block_hidden(
    stages: list[DSparkStage], embed: torch.Tensor, ids: torch.Tensor, addr: BlockAddressing, pools: Pools,
    ops: Backends,
) -> torch.Tensor:  # fmt: skip
    """The block rows' ids ``[T*B]`` through every stage -> the last stage's collapsed rows ``[T*B, D]``
    (before its ``norm``)."""
    n = stages[0].cfg.hc_mult
    x = embed[ids]
    h = x[:, None, :].expand(-1, n, -1).contiguous()
    pre = torch.zeros(x.shape[0], n, dtype=torch.float32, device=x.device)
    pre[:, 0] = 1.0
    for stage in stages:
        h, pre = stage.forward(h, pre, None, addr, pools, ops, {})
    return ops.dense.hc_collapse(streams(h, ops), pre)


def markov_bias(
    last: DSparkStage, prev_ids: torch.Tensor, ops: Backends
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bias [T, V] float32, embed [T, rank])`` of the Markov head for the previous tokens ``prev_ids [T]``."""
    m = last.markov_head
    e = m.embed.value[prev_ids]
    return ops.dense.linear(e.float(), m.head.value.float()).float(), e


def confidence(last: DSparkStage, x: torch.Tensor, markov_embed: torch.Tensor, ops: Backends) -> torch.Tensor:
    """The confidence head's raw output ``[N]`` for block rows ``x [N, D]`` and their Markov embeddings."""
    w = last.confidence_head.proj.value.float()
    return ops.dense.linear(torch.cat([x, markov_embed], dim=-1).float(), w)[:, 0]
