"""V4 attention: shared-KV MQA over a sliding window plus, on CSA / HCA layers, compressed entries.

Per layer (``p`` = ``layers.{i}.attn`` or ``mtp.{i}.attn``) the state is, as cache specs:
``{p}.swa_kv`` (window group: the rotated K=V of each token), ``{p}.compressor.state`` (window group: the
compressor's per-token ``kv`` and ``gate + ape`` score, float32), ``{p}.compressor.kv`` (compressed group:
one entry per ``ratio`` tokens) and, on CSA layers, ``{p}.indexer.compressor.state`` / ``{p}.indexer.keys``.

A step first writes its tokens' per-token state, then compresses every window that closes within the step,
then attends. Because all reads go through the pools by absolute position, any chunking of a prompt gives
the same result as one full forward.
"""

from __future__ import annotations

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.deepseek_v4.addressing import StepAddressing
from deepinfer_core.models.deepseek_v4.config import CSA, SLIDING, DeepseekV4Config
from deepinfer_core.models.deepseek_v4.params import Module, SharedInput, Slot
from deepinfer_core.models.deepseek_v4.rope import layer_inv_freq
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
from deepinfer_core.ops.quant_formats import FP8_BLOCK, dequant
from deepinfer_core.ops.weights import QuantizedWeight, Weight

Pools = dict[str, torch.Tensor]


def flat(pool: torch.Tensor) -> torch.Tensor:
    """``[blocks, entries_per_block, *entry]`` -> ``[slots, *entry]`` (a view: writes land in the pool)."""
    return pool.flatten(0, 1)


def entry_spec(
    name: str,
    group: str,
    tokens_per_entry: int,
    head_dim: int,
    dtype: torch.dtype,
    kv_format: Fp8KVFormat | None,
    window: int = 0,
) -> CacheSpec:
    """A pool of ``head_dim`` rows in ``dtype``, or of packed byte rows under an FP8 KV cache."""
    if kv_format is None:
        return CacheSpec(name, group, tokens_per_entry, (head_dim,), dtype, window=window)
    return CacheSpec(name, group, tokens_per_entry, (kv_format.row_bytes,), torch.uint8, window=window)


class Compressor(Module):
    """Gated pooling of ``ratio`` tokens into one entry; with ``overlap`` (CSA) each entry pools the Ca half
    of the previous window and the Cb half of its own window (``2 * ratio`` slots, Ca of window -1 empty)."""

    def __init__(self, cfg: DeepseekV4Config, ratio: int, head_dim: int, overlap: bool, name: str):
        coff = 2 if overlap else 1
        self.ratio, self.head_dim, self.overlap = ratio, head_dim, overlap
        self.name, self.eps = name, cfg.rms_norm_eps
        self.ape = Slot("ape", (ratio, coff * head_dim), "float32")
        self.wkv = Slot("wkv.weight", (coff * head_dim, cfg.hidden_size), "linear")
        self.wgate = Slot("wgate.weight", (coff * head_dim, cfg.hidden_size), "linear")
        self.norm = Slot("norm.weight", (head_dim,), "float32")

    def cache_specs(
        self, entries_name: str, dtype: torch.dtype, kv_format: Fp8KVFormat | None
    ) -> list[CacheSpec]:
        coff = 2 if self.overlap else 1
        window = (coff * self.ratio) - 1
        return [
            CacheSpec(
                f"{self.name}.state", "window", 1, (2, coff * self.head_dim), torch.float32, window=window
            ),
            entry_spec(entries_name, "compressed", self.ratio, self.head_dim, dtype, kv_format),
        ]

    def forward(
        self,
        kv: torch.Tensor,
        gate: torch.Tensor,
        addr: StepAddressing,
        pools: Pools,
        entries: torch.Tensor,
        ops: Backends,
        inv_freq: torch.Tensor,
        kv_format: Fp8KVFormat | None = None,
    ) -> None:
        """From the step's ``wkv`` and ``wgate`` projections: write the per-token state, then every entry whose
        window closes in the step (packed by ``kv_format`` when the entries pool is an FP8 KV pool)."""
        state = flat(pools[f"{self.name}.state"])
        ops.attention.write_compressor_state(
            state, addr.token_slots, kv, gate, self.ape.value, addr.positions
        )
        comp = addr.compression(self.ratio, self.overlap)
        if comp.entry_slots.numel() == 0:
            return
        ops.attention.compress_into(
            state, comp.src_slots, self.overlap, self.norm.value, self.eps, comp.entry_positions, inv_freq,
            entries, comp.entry_slots, kv_format=kv_format,
        )  # fmt: skip


class Indexer(Module):
    """Lightning indexer: its own overlapping compressor at ``index_head_dim`` produces keys; queries from the
    attention's ``q`` low-rank residual score them and keep the top ``index_topk`` visible entries."""

    def __init__(self, cfg: DeepseekV4Config, ratio: int, name: str):
        self.cfg, self.ratio, self.name = cfg, ratio, name
        hi, di = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = Slot("wq_b.weight", (hi * di, cfg.q_lora_rank), "linear")
        self.weights_proj = Slot("weights_proj.weight", (hi, cfg.hidden_size), "linear")
        self.compressor = Compressor(cfg, ratio, di, overlap=True, name=f"{name}.compressor")

    def cache_specs(self, dtype: torch.dtype) -> list[CacheSpec]:
        return self.compressor.cache_specs(f"{self.name}.keys", dtype, None)

    def forward(
        self,
        proj: list[torch.Tensor],
        qr: torch.Tensor,
        addr: StepAddressing,
        pools: Pools,
        ops: Backends,
        inv_freq: torch.Tensor,
    ) -> torch.Tensor:
        """``proj``: the step's compressor ``wkv``, ``wgate`` and ``weights_proj`` projections -> ``[T, k]``
        compressed-pool slots each query attends (``-1`` padding)."""
        keys = flat(pools[f"{self.name}.keys"])
        kv, gate, weights = proj
        self.compressor.forward(kv, gate, addr, pools, keys, ops, inv_freq)
        hi, di = self.cfg.index_n_heads, self.cfg.index_head_dim
        q = ops.dense.linear(qr, self.wq_b.value).view(qr.shape[0], hi, di)
        q = ops.dense.rope(q, addr.positions, inv_freq)
        cand = addr.compression(self.ratio, True).cand_slots
        scale = di**-0.5 * hi**-0.5
        return ops.fused.indexer_select(q, weights, scale, keys, cand, self.cfg.index_topk)


class Attention(Module):
    """Low-rank query, one shared K=V head, partial interleaved RoPE, sinks, grouped low-rank output."""

    def __init__(self, cfg: DeepseekV4Config, kind: str, ratio: int, name: str, dtype: torch.dtype):
        self.cfg, self.kind, self.ratio, self.name, self.dtype = cfg, kind, ratio, name, dtype
        h, d, hidden = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        self.attn_sink = Slot("attn_sink", (h,), "float32")
        self.wq_a = Slot("wq_a.weight", (cfg.q_lora_rank, hidden), "linear")
        self.q_norm = Slot("q_norm.weight", (cfg.q_lora_rank,), "float32")
        self.wq_b = Slot("wq_b.weight", (h * d, cfg.q_lora_rank), "linear")
        self.wkv = Slot("wkv.weight", (d, hidden), "linear")
        self.kv_norm = Slot("kv_norm.weight", (d,), "float32")
        self.wo_a = Slot(
            "wo_a.weight",
            (cfg.o_groups * cfg.o_lora_rank, h * d // cfg.o_groups),
            "linear",
            self._split_groups,
        )
        self.wo_b = Slot("wo_b.weight", (hidden, cfg.o_groups * cfg.o_lora_rank), "linear")
        if kind != SLIDING:
            self.compressor = Compressor(cfg, ratio, d, overlap=kind == CSA, name=f"{name}.compressor")
        if kind == CSA:
            self.indexer = Indexer(cfg, ratio, name=f"{name}.indexer")
        self.inv_freq = layer_inv_freq(cfg, compressed=kind != SLIDING)
        self.kv_format: Fp8KVFormat | None = None  # set by the model for kv_cache_dtype="fp8"

    def post_load(self) -> None:
        self.inv_freq = self.inv_freq.to(self.attn_sink.value.device)  # RoPE frequencies beside the weights
        # the projections of the layer input: FP8 ``wq_a`` + ``wkv``, and the BF16 compressor/indexer ones
        self.x_proj = SharedInput([self.wq_a, self.wkv])
        side = []
        if self.kind != SLIDING:
            side = [self.compressor.wkv, self.compressor.wgate]
        if self.kind == CSA:
            ic = self.indexer.compressor
            side += [ic.wkv, ic.wgate, self.indexer.weights_proj]
        self.side_proj = SharedInput(side) if side else None

    def _split_groups(self, w: Weight) -> list[Weight]:
        """``wo_a`` as one ``[o_lora_rank, in/groups]`` weight per output group (FP8 stays FP8 when the
        group boundary falls on a 128-row scale block; otherwise it is dequantized once at load)."""
        rank, groups = self.cfg.o_lora_rank, self.cfg.o_groups
        if isinstance(w, QuantizedWeight):
            if w.format != "fp8_block" or rank % FP8_BLOCK:
                w = dequant(w, self.dtype)
            else:
                b = rank // FP8_BLOCK
                return [
                    QuantizedWeight(
                        w.data[g * rank : (g + 1) * rank],
                        w.scale[g * b : (g + 1) * b],
                        w.format,
                        (rank, w.in_features),
                    )
                    for g in range(groups)
                ]
        return [w[g * rank : (g + 1) * rank] for g in range(groups)]

    def cache_specs(self) -> list[CacheSpec]:
        window = self.cfg.sliding_window - 1
        fmt, d = self.kv_format, self.cfg.head_dim
        specs = [entry_spec(f"{self.name}.swa_kv", "window", 1, d, self.dtype, fmt, window=window)]
        if self.kind != SLIDING:
            specs += self.compressor.cache_specs(f"{self.name}.compressor.kv", self.dtype, fmt)
        if self.kind == CSA:
            specs += self.indexer.cache_specs(self.dtype)
        return specs

    def forward(self, x: torch.Tensor, addr: StepAddressing, pools: Pools, ops: Backends) -> torch.Tensor:
        """``x [T, hidden]`` (normed) -> ``[T, hidden]``."""
        cfg, dense, pos = self.cfg, ops.dense, addr.positions
        t, h, d = x.shape[0], cfg.num_attention_heads, cfg.head_dim
        qr, kv = self.x_proj(x, ops)
        qr = dense.rms_norm(qr, self.q_norm.value, cfg.rms_norm_eps)
        # the query: normed per head and rotated by the attention step
        q = dense.linear(qr, self.wq_b.value).view(t, h, d)
        swa = flat(pools[f"{self.name}.swa_kv"])
        ops.fused.rms_norm_rope_store_kv(
            kv,
            self.kv_norm.value,
            cfg.rms_norm_eps,
            pos,
            self.inv_freq,
            swa,
            addr.token_slots,
            self.kv_format,
        )
        cmp_pool, cmp_slots = self._compressed(x, qr, addr, pools, ops)
        o = ops.fused.rope_sparse_attention_unrope(
            q, swa, addr.window_slots, cmp_pool, cmp_slots, self.attn_sink.value, d**-0.5, pos, self.inv_freq,
            kv_format=self.kv_format, q_norm_eps=cfg.rms_norm_eps,
        )  # fmt: skip
        return self._output(o.view(t, cfg.o_groups, h * d // cfg.o_groups), ops)

    def _compressed(self, x, qr, addr: StepAddressing, pools: Pools, ops: Backends):
        if self.kind == SLIDING:
            return None, None
        entries = flat(pools[f"{self.name}.compressor.kv"])
        kv, gate, *indexer = self.side_proj(x, ops)
        self.compressor.forward(kv, gate, addr, pools, entries, ops, self.inv_freq, self.kv_format)
        if self.kind == CSA:
            return entries, self.indexer.forward(indexer, qr, addr, pools, ops, self.inv_freq)
        return entries, addr.compression(self.ratio, False).cand_slots

    def _output(self, groups: torch.Tensor, ops: Backends) -> torch.Tensor:
        """Grouped low-rank projection: each head group to ``o_lora_rank``, then all groups to ``hidden``."""
        low = ops.dense.grouped_linear(groups, self.wo_a.value)  # [T, groups, o_lora_rank]
        return ops.dense.linear(low.flatten(1), self.wo_b.value)
