"""V4.1 attention (CSA2): shared-KV MQA over a sliding window plus, on compressed layers, the entries an
indexer picks from the compressed KV that a Full layer publishes (``docs/v41_reference.md``, 3.4-3.5).

State per layer ``p = layers.{i}.attn``, as cache specs: ``{p}.swa_kv`` (every layer; in the ``window`` group, and
for the decoder layers in a ``decoder`` window group of their own, which SWA bounded replay needs), and on Full
layers ``{p}.compressor.state`` (window group, ratio 2: each token's pooling ``kv`` and ``score``),
``{p}.compressor.kv`` (compressed KV, one entry per ``ratio`` tokens) and ``{p}.indexer.keys`` (index keys),
both in the ``compressed`` group and read by the Reindex and Reuse layers after it. Under
``kv_cache_dtype="auto"`` the pools hold V4.1's packed FP8 / FP4 entries (:mod:`.kv_formats`).

Within a step, an index source publishes its top-k (and the candidate source its candidate pool) in
``shared``, which later layers read: the step-local counterpart of the reference's ``shared_attn``. A Full
layer writes the entries that close in the step *before* its indexer scores them, in prefill and decode
alike, so decode equals prefill (the release's decode reads stale index keys; section 5).
"""

from __future__ import annotations

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.deepseek_v4.addressing import Compression, StepAddressing
from deepinfer_core.models.deepseek_v4.attention import flat
from deepinfer_core.models.deepseek_v4.params import Module, SharedInput
from deepinfer_core.models.deepseek_v41.config import DeepseekV41Config
from deepinfer_core.models.deepseek_v41.kv_formats import KVFormats, PackedKV
from deepinfer_core.models.deepseek_v41.roles import FULL, LayerRole
from deepinfer_core.models.deepseek_v41.rope import inv_freq
from deepinfer_core.models.deepseek_v41.weights import bf16, f32, fp8
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.quant_formats import dequant

Pools = dict[str, torch.Tensor]
Shared = dict[str, torch.Tensor]


def _spec(
    name: str, group: str, ratio: int, width: int, dtype: torch.dtype, codec: PackedKV | None, **kw
) -> CacheSpec:
    if codec is None:
        return CacheSpec(name, group, ratio, (width,), dtype, **kw)
    return CacheSpec.packed_entries(name, group, ratio, codec.fmt, **kw)


class Compressor(Module):
    """Full layers: ratio 1, ``latent = norm(wkv x)``; ratio 2, the two tokens of a group pooled by a float32
    softmax of ``wgate x`` per channel, then ``norm`` (no overlap, no position bias)."""

    def __init__(self, cfg: DeepseekV41Config, ratio: int):
        self.ratio, self.eps = ratio, cfg.rms_norm_eps
        d, hidden = cfg.head_dim, cfg.hidden_size
        self.wkv = bf16("wkv.weight", d, hidden)
        if ratio > 1:
            self.wgate = bf16("wgate.weight", d, hidden)
        self.norm = bf16("norm.weight", d)

    def post_load(self) -> None:
        """The ratio-2 pooling's zero position bias and zero RoPE frequency, made once on the weights' device (made
        in every step they were two more launches a layer, memsets inside a decode graph)."""
        if self.ratio > 1:
            device, d = self.wkv.value.device, self.wkv.shape[0]
            self.no_bias = torch.zeros(self.ratio, d, dtype=torch.float32, device=device)
            self.no_rope = torch.zeros(1, dtype=torch.float32, device=device)  # angle 0: cos 1, sin 0, exact

    def latent(
        self,
        proj: list[torch.Tensor],
        comp: Compression,
        addr: StepAddressing,
        state: torch.Tensor | None,
        ops: Backends,
    ) -> torch.Tensor:
        """The pre-RoPE latent of every entry that closes in the step, ``[E, head_dim]`` in entry order, from the
        step's ``wkv`` (and ratio 2: ``wgate``) projections ``proj``."""
        if self.ratio == 1:  # every token is an entry
            return ops.dense.rms_norm(proj[0], self.norm.value, self.eps)
        kv, score = proj
        ops.attention.write_compressor_state(state, addr.token_slots, kv, score, self.no_bias, addr.positions)
        src = state[comp.src_slots]  # [E, ratio, 2, d]: a closing group has all its tokens
        return ops.attention.compress(
            src[:, :, 0].to(kv.dtype),
            src[:, :, 1],
            self.norm.value,
            self.eps,
            comp.entry_positions,
            self.no_rope,
        )


class Indexer(Module):
    """An index query (``wq_b``, ``weights_proj``) on Full and Reindex layers; index keys (``wk``, ``k_norm``)
    on Full layers only."""

    def __init__(self, cfg: DeepseekV41Config, owns_keys: bool):
        self.cfg = cfg
        hi, di = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = fp8("wq_b.weight", hi * di, cfg.q_lora_rank)
        self.weights_proj = bf16("weights_proj.weight", hi, cfg.hidden_size)
        if owns_keys:
            self.wk = bf16("wk.weight", di, cfg.head_dim)
            self.k_norm = bf16("k_norm.weight", di)

    def store_keys(self, latent: torch.Tensor, positions: torch.Tensor, freq: torch.Tensor, pool: torch.Tensor,
                   slots: torch.Tensor, key_format, ops: Backends) -> None:  # fmt: skip
        """The index keys of entries ``latent [E, head_dim]`` (``wk``, normed, rotated) stored at ``slots``."""
        k = ops.dense.linear(latent, self.wk.value)
        ops.fused.rms_norm_rope_store_kv(
            k, self.k_norm.value, self.cfg.rms_norm_eps, positions, freq, pool, slots, key_format
        )

    def query(
        self, w: torch.Tensor, qr: torch.Tensor, pos: torch.Tensor, freq: torch.Tensor, codec, ops: Backends
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q [T, Hi, Di], weights [T, Hi])`` from the step's ``weights_proj`` projection ``w``; ``q``
        round-trips FP4 like the keys under a quantized cache."""
        hi, di = self.cfg.index_n_heads, self.cfg.index_head_dim
        q = ops.dense.linear(qr, self.wq_b.value).view(-1, hi, di)
        return ops.fused.index_query(q, w, di**-0.5 * hi**-0.5, pos, freq, codec)


class Attention(Module):
    def __init__(
        self,
        cfg: DeepseekV41Config,
        role: LayerRole,
        readers: tuple[int, ...],
        dtype: torch.dtype,
        decoder: bool = False,
    ):
        self.cfg, self.role, self.readers, self.dtype = cfg, role, readers, dtype
        self.window_group = "decoder" if decoder else "window"
        self.name = f"layers.{role.layer}.attn"
        h, d, hidden = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        g, rank = cfg.o_groups, cfg.o_lora_rank
        self.attn_sink = f32("attn_sink", h)
        self.wq_a = fp8("wq_a.weight", cfg.q_lora_rank, hidden)
        self.q_norm = bf16("q_norm.weight", cfg.q_lora_rank)
        self.wq_b = fp8("wq_b.weight", h * d, cfg.q_lora_rank)
        self.wkv = fp8("wkv.weight", d, hidden)
        self.kv_norm = bf16("kv_norm.weight", d)
        self.wo_a = fp8("wo_a.weight", g * rank, h * d // g)
        self.wo_b = fp8("wo_b.weight", hidden, g * rank)
        if role.kind == FULL:
            self.compressor = Compressor(cfg, role.ratio)
        if role.owns_query:
            self.indexer = Indexer(cfg, owns_keys=role.kind == FULL)
        if role.ratio:
            self.freq = inv_freq(cfg.qk_rope_head_dim, cfg.compress_rope_theta, cfg.compress_yarn)
        else:
            self.freq = inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, None)
        self.formats = KVFormats()

    def post_load(self) -> None:
        self.freq = self.freq.to(self.attn_sink.value.device)
        # the projections of the layer input as one matrix each: FP8 ``wq_a`` + ``wkv``, and the BF16 compressor
        # (``wkv``, ratio 2 ``wgate``) and index weights (``weights_proj``): one GEMV each at decode
        self.x_proj = SharedInput([self.wq_a, self.wkv])
        side = []
        if self.role.kind == FULL:
            side = [self.compressor.wkv] + ([self.compressor.wgate] if self.compressor.ratio > 1 else [])
        if self.role.owns_query:
            side.append(self.indexer.weights_proj)
        self.side_proj = SharedInput(side) if side else None
        rank = self.cfg.o_lora_rank
        w = dequant(self.wo_a.value, self.dtype)  # the reference holds wo_a dequantised
        self.wo_groups = [w[i * rank : (i + 1) * rank] for i in range(self.cfg.o_groups)]

    def cache_specs(self) -> list[CacheSpec]:
        c, f, i, r = self.cfg, self.formats, self.role.layer, self.role.ratio
        specs = [
            _spec(f"{self.name}.swa_kv", self.window_group, 1, c.head_dim, self.dtype, f.window,
                  window=c.sliding_window - 1, writer=i)
        ]  # fmt: skip
        if self.role.kind != FULL:
            return specs
        if r > 1:
            specs.append(
                CacheSpec(f"{self.name}.compressor.state", "window", 1, (2, c.head_dim), torch.float32,
                          window=r - 1, writer=i)
            )  # fmt: skip
        shared = dict(writer=i, readers=self.readers)
        specs.append(
            _spec(
                f"{self.name}.compressor.kv", "compressed", r, c.head_dim, self.dtype, f.compressed, **shared
            )
        )
        specs.append(
            _spec(
                f"{self.name}.indexer.keys", "compressed", r, c.index_head_dim, self.dtype, f.keys, **shared
            )
        )
        return specs

    def forward(
        self, x: torch.Tensor, addr: StepAddressing, pools: Pools, ops: Backends, shared: Shared
    ) -> torch.Tensor:
        """``x [T, hidden]`` (normed) -> ``[T, hidden]``."""
        c, dense, pos = self.cfg, ops.dense, addr.positions
        t, h, d = x.shape[0], c.num_attention_heads, c.head_dim
        qr, kv = self.x_proj(x, ops)
        qr = dense.rms_norm(qr, self.q_norm.value, c.rms_norm_eps)
        q = dense.linear(qr, self.wq_b.value).view(t, h, d)  # rotated by the attention step
        swa = flat(pools[f"{self.name}.swa_kv"])
        ops.fused.rms_norm_rope_store_kv(
            kv, self.kv_norm.value, c.rms_norm_eps, pos, self.freq, swa, addr.token_slots, self.formats.window
        )
        cmp_pool = cmp_slots = None
        if self.role.ratio:
            cmp_pool, cmp_slots = self._compressed(x, qr, addr, pools, ops, shared)
        o = ops.fused.rope_sparse_attention_unrope(
            q, swa, addr.window_slots, cmp_pool, cmp_slots, self.attn_sink.value, d**-0.5, pos, self.freq,
            kv_format=self.formats.window, cmp_format=self.formats.compressed,
        )  # fmt: skip
        low = dense.grouped_linear(o.view(t, c.o_groups, h * d // c.o_groups), self.wo_groups)
        return dense.linear(low.flatten(1), self.wo_b.value)

    def _compressed(self, x, qr, addr: StepAddressing, pools: Pools, ops: Backends, shared: Shared):
        role, f = self.role, self.formats
        comp = addr.compression(role.ratio, False)
        src = f"layers.{role.kv_source}.attn"
        proj = self.side_proj(x, ops) if self.side_proj is not None else []
        if role.kind == FULL:
            self._publish(proj[: self.compressor.ratio], comp, addr, pools, ops)
        cmp_pool = flat(pools[f"{src}.compressor.kv"])
        if not role.owns_query:
            return cmp_pool, shared["topk"]
        keys = flat(pools[f"{src}.indexer.keys"])
        q, weights = self.indexer.query(proj[-1], qr, addr.positions, self.freq, f.keys, ops)
        cand = comp.cand_slots
        if role.candidate_source:
            visible = (addr.positions + 1) // role.ratio
            scores = ops.attention.indexer_scores(q, weights, keys, cand, key_format=f.keys)
            c = self.cfg
            shared["candidates"] = ops.attention.candidate_blocks(
                scores, visible, c.candidate_topk_blocks, c.candidate_block_size
            )
        elif role.uses_candidates:
            cand = torch.where(shared["candidates"], cand, -1)
        slots = ops.attention.indexer_topk_slots(
            q, weights, keys, cand, self.cfg.index_topk, key_format=f.keys
        )
        shared["topk"] = slots
        return cmp_pool, slots

    def _publish(self, proj, comp: Compression, addr: StepAddressing, pools: Pools, ops: Backends) -> None:
        """Write the compressed KV and index keys of every entry that closes in the step (``proj``: the
        compressor's projections of the step)."""
        state = pools.get(f"{self.name}.compressor.state")
        latent = self.compressor.latent(proj, comp, addr, None if state is None else flat(state), ops)
        if latent.shape[0] == 0:
            return
        at = comp.entry_positions  # an entry rotates at its group's first position
        keys = flat(pools[f"{self.name}.indexer.keys"])
        self.indexer.store_keys(latent, at, self.freq, keys, comp.entry_slots, self.formats.keys, ops)
        pool, cmp = flat(pools[f"{self.name}.compressor.kv"]), self.compressor
        if cmp.ratio == 1:  # every token an entry: its projection normed, rotated and stored in one step
            ops.fused.rms_norm_rope_store_kv(
                proj[0],
                cmp.norm.value,
                cmp.eps,
                at,
                self.freq,
                pool,
                comp.entry_slots,
                self.formats.compressed,
            )
        else:
            rotated = ops.dense.rope(latent[:, None], at, self.freq)[:, 0]
            ops.attention.store_kv(pool, comp.entry_slots, rotated, self.formats.compressed)
