"""DeepseekV4ForCausalLM: embeddings -> ``hc_mult`` mHC streams -> decoder blocks -> hc_head -> norm -> head.

The model holds no device code: every kernel goes through ``backends.dense / .attention / .moe``; the
model only indexes, reshapes and adds. State lives in the engine's paged pools (see :meth:`cache_specs`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch
from deepinfer_core.models.deepseek_v4.addressing import StepAddressing
from deepinfer_core.models.deepseek_v4.block import Block, MTPBlock, hc_params, run_sublayers
from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointReader
from deepinfer_core.models.deepseek_v4.config import CSA, SLIDING, DeepseekV4Config
from deepinfer_core.models.deepseek_v4.loader import count_mtp_modules, load_weights, read_config
from deepinfer_core.models.deepseek_v4.params import Module, Slot
from deepinfer_core.models.weight_checks import LoadOptions
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.kv_fp8 import Fp8KVFormat, is_fp8
from deepinfer_core.ops.mhc import HCParams


class DeepseekV4ForCausalLM(CausalLM, Module):
    def __init__(
        self, cfg: DeepseekV4Config, backends: Backends, dtype: torch.dtype, num_mtp_layers: int = 0
    ):
        self.cfg, self.backends, self.dtype = cfg, backends, dtype
        self.vocab_size = cfg.vocab_size
        self.max_position_embeddings = cfg.max_position_embeddings
        self.eos_token_ids = list(cfg.eos_token_ids)
        self.num_mtp_layers = num_mtp_layers
        v, d, n = cfg.vocab_size, cfg.hidden_size, cfg.hc_mult
        self.embed = Slot("embed.weight", (v, d), "model")
        self.layers = [
            Block(
                cfg, cfg.layer_types[i], cfg.compress_ratios[i], cfg.mlp_layer_types[i], f"layers.{i}", dtype
            )
            for i in range(cfg.num_hidden_layers)
        ]
        self.norm = Slot("norm.weight", (d,), "float32")
        self.hc_head_fn = Slot("hc_head_fn", (n, n * d), "float32")
        self.hc_head_base = Slot("hc_head_base", (n,), "float32")
        self.hc_head_scale = Slot("hc_head_scale", (1,), "float32")
        if not cfg.tie_word_embeddings:
            self.head = Slot("head.weight", (v, d), "model")
        self.mtp = [MTPBlock(cfg, i, dtype) for i in range(num_mtp_layers)]
        self.head_hc: HCParams | None = None

    def post_load(self) -> None:
        self.head_hc = hc_params(self, "hc_head", self.cfg)

    @classmethod
    def from_checkpoint(
        cls, path: Path, backends: Backends, dtype: torch.dtype, options: LoadOptions = LoadOptions()
    ) -> DeepseekV4ForCausalLM:
        cfg, _ = read_config(Path(path))
        reader = CheckpointReader(Path(path), allow_external=options.allow_external_shards)
        try:
            model = cls(cfg, backends, dtype, count_mtp_modules(reader.keys(), cfg.num_nextn_predict_layers))
            model.layout = load_weights(model, reader, dtype, backends.memory.device, options)
        finally:
            reader.close()
        return model

    def use_kv_cache_dtype(self, kv_cache_dtype: str) -> None:
        """FP8: every attention's window and compressed KV pools hold packed rows (indexer keys do not)."""
        fmt = None
        if is_fp8(kv_cache_dtype):
            fmt = Fp8KVFormat(self.cfg.head_dim, self.cfg.qk_rope_head_dim, self.dtype)
        for block in self.layers + self.mtp:
            block.attn.kv_format = fmt

    def cache_specs(self) -> list[CacheSpec]:
        return [s for block in self.layers + self.mtp for s in block.attn.cache_specs()]

    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        """-> the mHC streams ``[T, hc_mult, hidden]`` after the last block (before ``hc_head``)."""
        lo, hi = batch.layer_range or (0, len(self.layers))
        if lo != 0:
            raise ValueError(
                f"layer_range={batch.layer_range}: V4 runs from layer 0 (its input is the embedding)"
            )
        addr = batch.plan if batch.plan is not None else StepAddressing(batch, self.cfg.sliding_window)
        # the embedding row copied into every stream by one gather (not a gather, then a copy of the expansion)
        h = self._embed(batch.input_ids[:, None].expand(-1, self.cfg.hc_mult))
        subs = [
            s
            for block in self.layers[lo:hi]
            for s in block.sublayers(batch.input_ids, addr, kv, self.backends)
        ]
        return run_sublayers(h, subs, self.backends) if subs else h

    supports_graphs = True

    def plan(self, batch: ForwardBatch, context_bucket: int | None = None) -> StepAddressing:
        """The step's slot tables, built where ``batch`` lives (the host) with every host-side check; the
        runner moves them to the device with the batch. ``context_bucket``: static shapes for graph replay."""
        return StepAddressing(batch, self.cfg.sliding_window, self._kinds(), context_bucket)

    device_plan = True

    def plan_on_device(self, batch: ForwardBatch, context_bucket: int) -> StepAddressing:
        """:meth:`plan`'s static tables built on the device (:meth:`StepAddressing.static_on_device`)."""
        return StepAddressing.static_on_device(
            batch, self.cfg.sliding_window, self._kinds(), context_bucket, self.backends.fused.static_plan
        )

    def _kinds(self) -> tuple[tuple[int, bool], ...]:
        kinds = {
            (block.attn.ratio, block.attn.kind == CSA) for block in self.layers if block.attn.kind != SLIDING
        }
        return tuple(sorted(kinds))

    def plan_draft(self, batch: ForwardBatch, context_bucket: int | None = None) -> StepAddressing:
        """The tables of an MTP draft step: MTP blocks attend to their sliding window only."""
        return StepAddressing(batch, self.cfg.sliding_window, (), context_bucket)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [L, hc_mult, hidden]`` rows of :meth:`forward` -> ``[L, vocab]`` float32."""
        return self._logits(hidden, self.head_hc, self.norm)

    def mtp_forward(
        self, index: int, batch: ForwardBatch, prev_hidden: torch.Tensor, kv: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """One draft step of MTP module ``index``.

        Row ``t`` of ``batch`` is position ``p = batch.positions[t]`` and ``batch.input_ids[t]`` is the token
        at ``p + 1`` (the next token); ``prev_hidden [T, hc_mult, hidden]`` are the streams at ``p`` from
        :meth:`forward` (or from MTP module ``index - 1``). The module writes its sliding-window state
        ``mtp.{index}.attn.*`` at ``p`` (so it must have seen every earlier position, like the main model)
        and returns its output streams ``[T, hc_mult, hidden]``; :meth:`mtp_compute_logits` turns rows of
        them into draft logits for position ``p + 2``. With ``batch.plan`` (:meth:`plan_draft`, built on the
        host) the step has static shapes and no host synchronisation, so it can be captured as a graph.
        """
        block = self._mtp_block(index)
        addr = batch.plan if batch.plan is not None else StepAddressing(batch, self.cfg.sliding_window)
        h = block.embed_streams(self._embed(batch.input_ids), prev_hidden, self.backends)
        return block.forward(h, batch.input_ids, addr, kv, self.backends)

    def mtp_compute_logits(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of :meth:`mtp_forward`'s output -> draft logits ``[L, vocab]`` float32 (shared head)."""
        b = self._mtp_block(index)
        return self._logits(hidden, b.head_hc, b.norm)

    def _mtp_block(self, index: int) -> MTPBlock:
        if not 0 <= index < self.num_mtp_layers:
            raise IndexError(
                f"MTP module {index} does not exist: the checkpoint has {self.num_mtp_layers} (mtp.* tensors)"
            )
        return self.mtp[index]

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed.value[input_ids]

    def _logits(self, hidden: torch.Tensor, head_hc: HCParams, norm: Slot) -> torch.Tensor:
        cfg, dense = self.cfg, self.backends.dense
        x = dense.hc_head(hidden, head_hc)
        x = dense.rms_norm(x, norm.value, cfg.rms_norm_eps)
        head = self.embed.value if cfg.tie_word_embeddings else self.head.value
        return dense.linear(x, head).float()
