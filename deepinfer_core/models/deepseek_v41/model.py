"""DeepseekV41ForCausalLM: embedding -> Engram hashes -> ``hc_mult`` streams -> blocks -> the last FFN site's
``pre`` collapses the streams -> norm -> head (no ``hc_head``).

The model holds no device code: kernels go through ``backends``; state lives in the engine's paged pools
(:meth:`cache_specs`): per layer the window KV, the Full layers' compressor state, compressed KV and index
keys, and the Engram look-back (each token's compressed id, the last ``max_ngram_size - 1`` kept).

DSpark (:mod:`.dspark`): when the checkpoint holds the ``mtp.*`` stages they are loaded; :meth:`enable_dspark`
(called by the DSpark proposer before the engine sizes its pools) adds their window KV to :meth:`cache_specs`
and makes :meth:`forward` append the target layers' taps to every hidden row.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch
from deepinfer_core.models.deepseek_v4.addressing import StepAddressing
from deepinfer_core.models.deepseek_v4.attention import flat
from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointError, CheckpointReader
from deepinfer_core.models.deepseek_v4.params import Module
from deepinfer_core.models.deepseek_v41.block import Block, EngramRows, streams
from deepinfer_core.models.deepseek_v41.config import DeepseekV41Config
from deepinfer_core.models.deepseek_v41.dspark import (
    BlockAddressing,
    DSparkConfig,
    DSparkStage,
    block_hidden,
    confidence,
    markov_bias,
    write_context,
)
from deepinfer_core.models.deepseek_v41.engram import EngramHasher
from deepinfer_core.models.deepseek_v41.kv_formats import kv_formats
from deepinfer_core.models.deepseek_v41.roles import decoder_start
from deepinfer_core.models.deepseek_v41.shards import check_shards
from deepinfer_core.models.deepseek_v41.vision.image_processor import ImageInputError, ProcessedImage
from deepinfer_core.models.deepseek_v41.vision.inputs import ImageSpan, expand_placeholders
from deepinfer_core.models.deepseek_v41.vision.weights import VisionWeights
from deepinfer_core.models.deepseek_v41.weights import LoadedTensors, OwnsExpert, bf16, load_weights
from deepinfer_core.models.weight_checks import LoadOptions
from deepinfer_core.ops.act_quant import ACTIVATION_QUANT_MODES, FP8_ACT_BLOCK, mark_activation_quant
from deepinfer_core.ops.backends import Backends

ARCHITECTURE = "DeepseekV41ForCausalLM"
MODEL_TYPE = "deepseek_v41"


def host_memory_bytes() -> int:
    """Physical memory of this host, bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def read_config(path: Path) -> DeepseekV41Config:
    """``config.json`` of ``path``, checked to be a DeepSeek-V4.1 causal LM."""
    file = Path(path) / "config.json"
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: cannot read the model config: {e}") from e
    archs = raw.get("architectures") or []
    if ARCHITECTURE not in archs and raw.get("model_type") != MODEL_TYPE:
        raise CheckpointError(
            f"{file}: architecture {archs or raw.get('model_type')!r} is not {ARCHITECTURE!r} "
            f"(model_type {MODEL_TYPE!r})"
        )
    return DeepseekV41Config.from_dict(raw)


@dataclass
class StepPlan:
    """The slot tables of one step: V4's addressing (window, compressions) and the Engram look-back slots
    ``history [T, max_ngram_size]`` (``-1`` before the sequence start); for a model with a decoder, the
    decoder layers' addressing ``late`` (their own window group; with bounded replay, over the tail's rows
    only, reading no window position below the tail's ``state_from``). ``late_shares``: ``late`` is ``addr``
    with other window slots."""

    addr: StepAddressing
    history: torch.Tensor | None
    late: StepAddressing | None = None
    late_shares: bool = False
    #: a static step's Engram rows, read before it (:meth:`DeepseekV41ForCausalLM.prepare_static`)
    engram: list[torch.Tensor] | None = None

    def to(self, device: torch.device) -> StepPlan:
        addr = self.addr.to(device)
        late = self.late
        if late is not None:
            late = late.window_to(device, addr) if self.late_shares else late.to(device)
        history = None if self.history is None else self.history.to(device)
        return StepPlan(addr, history, late, self.late_shares)

    def tensors(self) -> list[torch.Tensor]:
        """Every table and the Engram rows, in a fixed order (graph replay copies them into its buffers)."""
        out = self.addr.tensors() + ([] if self.history is None else [self.history])
        if self.late is not None:
            late = self.late
            out += [late.token_slots, late.window_slots] if self.late_shares else late.tensors()
        return out + (self.engram or [])


class DeepseekV41ForCausalLM(CausalLM, Module):
    def __init__(
        self, cfg: DeepseekV41Config, backends: Backends, dtype: torch.dtype, with_dspark: bool = False
    ):
        """``with_dspark``: build the DSpark stages (the checkpoint holds ``mtp.*``)."""
        self.cfg, self.backends, self.dtype = cfg, backends, dtype
        self.vocab_size = cfg.vocab_size
        self.max_position_embeddings = cfg.max_position_embeddings
        self.eos_token_ids = list(cfg.eos_token_ids)
        self.num_layers = cfg.num_hidden_layers
        roles = cfg.roles
        readers = {
            r.layer: tuple(x.layer for x in roles if x.kv_source == r.layer and x.layer != r.layer)
            for r in roles
        }
        v, d = cfg.vocab_size, cfg.hidden_size
        self.embed = bf16("embed.weight", v, d)
        #: the first decoder layer (after the last Full layer: it keeps nothing but its window), or None
        self.decoder_start = dec = decoder_start(roles)
        self.layers = [
            Block(cfg, r, readers[r.layer], dtype, dec is not None and r.layer >= dec) for r in roles
        ]
        self.norm = bf16("norm.weight", d)
        self.head = bf16("head.weight", v, d)
        #: the vision tower's slots (``vision.*``, ``aligner.*``, the delimiters), or None (text only)
        self.vision = VisionWeights(cfg.vision, dtype) if cfg.vision is not None else None
        self.hasher: EngramHasher | None = None
        self.loaded: LoadedTensors | None = None
        self.kinds = tuple(sorted({(r.ratio, False) for r in roles if r.ratio}))
        self.dspark = DSparkConfig.from_config(cfg) if with_dspark else None
        if self.dspark is not None:
            self.mtp = [DSparkStage(cfg, self.dspark, i, dtype) for i in range(self.dspark.num_stages)]
            self.num_dspark_stages, self.dspark_block_size = self.dspark.num_stages, self.dspark.block_size
        #: DSpark is on: stage caches in :meth:`cache_specs`, taps in :meth:`forward`'s rows
        self.dspark_on = False
        #: the device reads the Engram tables in place, inside the step (:meth:`place_engram`)
        self.engram_in_step = False

    @classmethod
    def from_checkpoint(
        cls,
        path: Path,
        backends: Backends,
        dtype: torch.dtype,
        options: LoadOptions = LoadOptions(),
        owns_expert: OwnsExpert | None = None,
    ) -> DeepseekV41ForCausalLM:
        """Stream the checkpoint in; ``owns_expert(layer, expert)`` (expert parallelism) limits the routed
        experts read to this rank's. What was read is kept in :attr:`loaded`."""
        cfg = read_config(Path(path))
        check_shards(Path(path))
        reader = CheckpointReader(Path(path), allow_external=options.allow_external_shards)
        try:
            model = cls(cfg, backends, dtype, any(k.startswith("mtp.") for k in reader.keys()))
            device = backends.memory.device
            if cfg.engram is not None:
                model.hasher = EngramHasher.build(cfg.engram, Path(path)).to(device)
            model.loaded = load_weights(model, reader, dtype, device, options, owns_expert)
        finally:
            reader.close()
        return model

    def place_engram(self, in_step: bool | None) -> bool:
        """Make the Engram tables readable by the device in place (``EngineConfig.engram_in_step``): steps then
        read their rows on the device, inside their graphs (:mod:`.engram_tier`). ``None``: where the platform
        reads host memory and the tables take at most half the host's memory. Returns whether they are."""
        tables = [b.engram.embed.value for b in self.layers if b.engram is not None]
        memory = self.backends.memory
        if not tables or in_step is False:
            return False
        if not memory.reads_host_memory:
            if in_step:
                raise ValueError(
                    "engram_in_step=True: this platform's device cannot read host memory in place "
                    "(MemoryOps.reads_host_memory); use engram_in_step=None or False"
                )
            return False
        if in_step is None and self.host_tier_bytes > host_memory_bytes() // 2:
            return False
        for t in tables:
            t.in_step(memory)
        self.engram_in_step = True
        return True

    @property
    def host_tier_bytes(self) -> int:
        """Bytes of the Engram tables: memory-mapped on the host, outside the weights and the KV budget."""
        return sum(b.engram.embed.value.nbytes for b in self.layers if b.engram is not None)

    def use_kv_cache_dtype(self, kv_cache_dtype: str) -> None:
        """``"auto"``: V4.1's trained formats (FP8 window KV, FP4 compressed KV and index keys, FP4 index
        queries); ``"unquantized"``: plain rows in the model dtype and no round trip."""
        c = self.cfg
        fmts = kv_formats(kv_cache_dtype, c.head_dim, c.index_head_dim, self.dtype)
        if fmts.quantized and not self.backends.attention.packed_kv:
            raise ValueError(
                f"kv_cache_dtype={kv_cache_dtype!r}: DeepSeek-V4.1's trained FP8 / FP4 cache needs a platform "
                f"whose attention reads packed pools ({type(self.backends.attention).__name__} does not declare "
                "packed_kv); use kv_cache_dtype='unquantized' on this platform"
            )
        for block in self.layers + self._stages():
            block.attn.formats = fmts

    def use_activation_quant(self, mode: str) -> None:
        """``"fp8"``: every FP8 / FP4 GEMM quantises its input as DeepSeek's release does (e4m3, one ue8m0 scale
        per 32 values; :mod:`deepinfer_core.ops.act_quant`); ``"none"``: GEMMs read the activations as they are
        (the exact path). ``wo_a`` is held dequantised, as the release holds it, so its GEMM is never quantised."""
        if mode not in ACTIVATION_QUANT_MODES:
            raise ValueError(f"activation_quant={mode!r}: expected one of {list(ACTIVATION_QUANT_MODES)}")
        ops = self.backends
        lacking = [
            type(o).__name__ for o in (ops.dense, ops.moe) if mode != "none" and not o.activation_quant
        ]
        if lacking:
            raise ValueError(
                f"activation_quant={mode!r}: the platform's {' and '.join(lacking)} do not declare activation_quant "
                "(their GEMMs would ignore the quantisation); use activation_quant='none'"
            )
        weights = [slot.value for _, slot in self.named_slots()]
        weights += [s.fused for s in self.shared_inputs() if s.fused is not None]
        mark_activation_quant(weights, FP8_ACT_BLOCK if mode == "fp8" else 0)

    def cache_specs(self) -> list[CacheSpec]:
        blocks = self.layers + (self._stages() if self.dspark_on else [])
        specs = [s for block in blocks for s in block.attn.cache_specs()]
        if self.cfg.engram is not None:
            n = self.cfg.engram.max_ngram_size
            specs.append(CacheSpec("engram.tokens", "window", 1, (1,), torch.int64, window=n - 1, writer=0))
        return specs

    def bounded_replay(self) -> tuple[int, int] | None:
        """The decoder layers (after the last Full layer) over the last ``sliding_window`` rows of a chunk:
        they keep only their window KV (``decoder`` group). Not exact: a decoder row depends on every earlier
        row of the chunk through the stacked windows; rows dropped earlier in a chunk, and positions before a
        prefix-cache hit, are not attended (``docs/models.md``)."""
        if self.decoder_start is None:
            return None
        return self.decoder_start, self.cfg.sliding_window

    #: static steps have static shapes (the context bucket sizes the candidate tables) and read the Engram
    #: rows before the step (:meth:`prepare_static`), so a platform may capture them as graphs
    supports_graphs = True

    @property
    def device_plan(self) -> bool:  # type: ignore[override]
        """Static plans built on the device where nothing has to be read before the step: no Engram, or its
        tables read inside the step (:meth:`place_engram`); else :meth:`prepare_static` fills the host plan."""
        return self.hasher is None or self.engram_in_step

    def plan_on_device(self, batch: ForwardBatch, context_bucket: int) -> StepPlan:
        """:meth:`plan`'s static tables built on the device (V4's :meth:`StepAddressing.static_on_device`; the
        Engram look-back and the decoder's window slots the same way)."""
        addr = StepAddressing.static_on_device(
            batch, self.cfg.sliding_window, self.kinds, context_bucket, self.backends.fused.static_plan
        )
        history = None
        if self.cfg.engram is not None:
            shifts = torch.arange(self.cfg.engram.max_ngram_size, device=addr.positions.device)
            history = addr.device_window_slots(addr.positions[:, None] - shifts[None, :])
        if self.decoder_start is None:
            return StepPlan(addr, history)
        return StepPlan(
            addr, history, addr.device_window_group(batch.block_tables, "decoder"), late_shares=True
        )

    def plan(self, batch: ForwardBatch, context_bucket: int | None = None) -> StepPlan:
        window = self.cfg.sliding_window
        addr = StepAddressing(batch, window, self.kinds, context_bucket)
        history = None
        if self.cfg.engram is not None:
            shifts = torch.arange(self.cfg.engram.max_ngram_size, device=addr.positions.device)
            pos = addr.positions[:, None] - shifts[None, :]
            history = addr.slots("window", addr.req[:, None].expand_as(pos), pos, 1)
        if self.decoder_start is None:
            return StepPlan(addr, history)
        tail = batch.tail
        if tail is None:
            return StepPlan(addr, history, addr.with_window_group("decoder"), late_shares=True)
        late = StepAddressing(tail.batch, window, self.kinds).with_window_group("decoder", tail.state_from)
        return StepPlan(addr, history, late)

    # ------------------------------------------------------------------ images (see .vision)

    def prepare_images(self, token_ids: list[int], images: list[object]) -> tuple[list[int], list[ImageSpan]]:
        """Each image placeholder of ``token_ids`` expanded into its image's span (DeepSeek's rule)."""
        if self.cfg.vision is None and not images:
            return list(token_ids), []
        if self.cfg.vision is None:
            raise ImageInputError(
                "this checkpoint has no vision tower (no vision_config / vision_n_layers = 0): it takes no images"
            )
        return expand_placeholders(token_ids, images, self.cfg.vision)

    def encode_images(self, images: list[ProcessedImage]) -> list[torch.Tensor]:
        """Each image's span of embeddings ``[num_tokens, hidden]`` (model dtype), the ViT run once for all."""
        spans = self.vision.tower.encode(self.backends, images)
        return [s.to(self.dtype) for s in spans]

    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        """-> ``[T, hidden]``: the streams after the last block, collapsed by its FFN site's ``pre``.

        Image rows (``batch.image_rows``) take ``batch.image_embeds`` instead of the token embedding before
        the first layer; they are dead tokens for Engram (no n-gram reads or spans them, no injection) and
        pick experts with ``bias_vl``."""
        if batch.layer_range not in (None, (0, len(self.layers))):
            raise ValueError(f"layer_range={batch.layer_range}: V4.1 runs every layer")
        plan = batch.plan if batch.plan is not None else self.plan(batch)
        ops, c = self.backends, self.cfg
        image_mask = None
        if batch.image_rows is not None:  # image steps are never static (the runner keeps them dynamic)
            image_mask = torch.zeros_like(batch.input_ids, dtype=torch.bool)
            image_mask[batch.image_rows] = True
        if plan.engram is not None:
            engram: EngramRows | None = EngramRows(plan.engram)
        else:
            engram = self._fetch_engram(batch.input_ids, plan, kv, image_mask)
        x = self.embed.value[batch.input_ids]
        if image_mask is not None:
            x = x.index_copy(0, batch.image_rows, batch.image_embeds.to(x.dtype))
        h = x[:, None, :].expand(-1, c.hc_mult, -1).contiguous()
        pre = torch.zeros(x.shape[0], c.hc_mult, dtype=torch.float32, device=x.device)
        pre[:, 0] = 1.0
        shared: dict[str, torch.Tensor] = {}
        # DSpark reads its target layers (never with bounded replay: the engine refuses that pair)
        taps: list[torch.Tensor] = []
        targets = self.dspark.target_layer_ids if self.dspark_on else ()
        addr, tail, early = plan.addr, batch.tail, None
        for i, block in enumerate(self.layers):
            if i == self.decoder_start:
                addr = plan.late
                if tail is not None:  # bounded replay: the decoder runs on the tail's rows only
                    h = streams(h, ops)
                    early, rows = ops.dense.hc_collapse(h, pre), tail.rows
                    h, pre = h[rows], pre[rows]
                    if engram is not None:
                        engram.select = rows
                    if image_mask is not None:
                        image_mask = image_mask[rows]
                    shared = {k: v[rows] for k, v in shared.items()}
            tap = taps if i in targets else None
            h, pre = block.forward(h, pre, engram, addr, kv, ops, shared, tap, image_mask)
        out = ops.dense.hc_collapse(streams(h, ops), pre)
        if early is not None:
            return early.index_copy(0, tail.rows, out)
        return torch.cat([out, *taps], dim=-1) if taps else out

    def prepare_static(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> None:
        """A static step may be replayed as a graph, which cannot wait for the host tier mid-step: write the
        step's compressed ids, hash them and read every Engram layer's rows now (waiting for them), and keep
        the rows in the plan, among its graph inputs. The rows then do not overlap this step's first layers
        (they do in dynamic steps). Tables the device reads in place (:meth:`place_engram`) are read inside
        the step instead, graph and all: nothing to wait for here."""
        if self.hasher is None or self.engram_in_step:
            return
        plan = batch.plan
        rows = self._fetch_engram(batch.input_ids, plan, kv)
        plan.engram = [p.wait(self.embed.value.dtype) for p in rows.pending]

    def _fetch_engram(
        self,
        input_ids: torch.Tensor,
        plan: StepPlan,
        kv: dict[str, torch.Tensor],
        image_mask: torch.Tensor | None = None,
    ) -> EngramRows | None:
        """Write the step's compressed ids to the look-back pool (image positions as ``-1``, dead: an
        n-gram stops there), hash each position's n-grams, and start reading every Engram layer's rows
        (:mod:`.engram_tier`)."""
        if self.hasher is None:
            return None
        pool = flat(kv["engram.tokens"])
        ids = self.hasher.token_map[input_ids]
        if image_mask is not None:
            ids = torch.where(image_mask, -1, ids)
        self.backends.attention.store_kv(pool, plan.addr.token_slots, ids[:, None], None)
        hash_ids = self.hasher.rows(pool, plan.history, self.backends)
        layers = sorted((b.engram for b in self.layers if b.engram is not None), key=lambda e: e.index)
        return EngramRows([e.fetch(hash_ids) for e in layers])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        dense = self.backends.dense
        x = dense.rms_norm(hidden[:, : self.cfg.hidden_size], self.norm.value, self.cfg.rms_norm_eps)
        return dense.linear(x, self.head.value).float()

    # ------------------------------------------------------------------ DSpark (see .dspark)

    def _stages(self) -> list[DSparkStage]:
        return self.mtp if self.dspark is not None else []

    def enable_dspark(self) -> None:
        if self.dspark is None:
            raise ValueError(
                "the checkpoint has no DSpark stages (no mtp.* tensors or dspark_block_size = 0)"
            )
        self.dspark_on = True

    def plan_draft(self, batch: ForwardBatch, context_bucket: int | None = None) -> StepPlan:
        """DSpark steps read and write the stages' windows only."""
        return StepPlan(StepAddressing(batch, self.cfg.sliding_window, (), context_bucket), None)

    def dspark_context(self, batch: ForwardBatch, hidden: torch.Tensor, kv: dict[str, torch.Tensor]) -> None:
        d = self.cfg.hidden_size
        addr = self._draft_addr(batch)
        write_context(self.mtp, hidden[:, d:], addr.positions, addr.token_slots, kv, self.backends)

    def dspark_block(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        addr = self._draft_addr(batch)
        b = self.dspark.block_size
        ids = torch.full(
            (batch.input_ids.shape[0], b), self.dspark.noise_token_id, device=batch.input_ids.device
        )
        ids[:, 0] = batch.input_ids
        block = BlockAddressing.build(addr.positions, addr.window_slots, b)
        x = block_hidden(self.mtp, self.embed.value, ids.flatten(), block, kv, self.backends)
        return x.view(-1, b, x.shape[-1])

    def dspark_logits(self, x: torch.Tensor) -> torch.Tensor:
        dense = self.backends.dense
        h = dense.rms_norm(x, self.mtp[-1].norm.value, self.cfg.rms_norm_eps)
        return dense.linear(h, self.head.value).float()

    def dspark_markov(self, prev_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return markov_bias(self.mtp[-1], prev_ids, self.backends)

    def dspark_confidence(self, x: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        return confidence(self.mtp[-1], x, markov_embed, self.backends)

    def _draft_addr(self, batch: ForwardBatch) -> StepAddressing:
        plan = batch.plan if batch.plan is not None else self.plan_draft(batch)
        return plan.addr
