"""The contract every model architecture implements for the engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from deepinfer_core.kv.spec import CacheSpec
    from deepinfer_core.models.batch import ForwardBatch
    from deepinfer_core.models.weight_checks import LoadOptions
    from deepinfer_core.ops.backends import Backends


class CausalLM(ABC):
    """A decoder model written against :class:`~deepinfer_core.ops.backends.Backends`; holds no device code."""

    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: list[int]
    #: number of MTP (multi-token prediction) modules in the checkpoint; 0 if none
    num_mtp_layers: int = 0
    #: DSpark block-draft stages in the checkpoint (V4.1, ``mtp.*``) and the block they draft; 0 if none
    num_dspark_stages: int = 0
    dspark_block_size: int = 0
    #: layers numbered ``0 .. num_layers - 1`` (draft modules after the main layers), as cache specs'
    #: ``writer`` / ``readers`` and :meth:`bounded_replay` name them; ``None``: the model does not number them
    num_layers: int | None = None

    @classmethod
    @abstractmethod
    def from_checkpoint(
        cls, path: Path, backends: Backends, dtype: torch.dtype, options: LoadOptions | None = None
    ) -> CausalLM:
        """Load config and weights from a checkpoint directory onto ``backends.memory.device``, checking
        what ``options`` (:class:`~deepinfer_core.models.weight_checks.LoadOptions`) asks: the checkpoint
        is untrusted input."""

    def use_kv_cache_dtype(self, kv_cache_dtype: str) -> None:
        """Store attention KV as ``kv_cache_dtype`` (see :mod:`deepinfer_core.ops.kv_fp8`); called once, after
        loading and before :meth:`cache_specs`. A model that supports only "auto" keeps this default."""
        if kv_cache_dtype != "auto":
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r}: {type(self).__name__} supports only 'auto'")

    def use_activation_quant(self, mode: str) -> None:
        """Quantise the inputs of quantized GEMMs as ``mode`` says (``EngineConfig.activation_quant``,
        :mod:`deepinfer_core.ops.act_quant`); called once, after loading. A model without such numerics keeps
        this default, which takes only "none"."""
        if mode != "none":
            raise ValueError(
                f"activation_quant={mode!r}: {type(self).__name__} has no activation quantisation; use 'none'"
            )

    @abstractmethod
    def cache_specs(self) -> list[CacheSpec]:
        """All state kept between steps (see :mod:`deepinfer_core.kv.spec`)."""

    @abstractmethod
    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        """Run the decoder over ``batch``, reading and writing ``kv`` (spec name -> pool tensor).

        Returns the final hidden state of every token row (for V4: the mHC streams ``[T, hc_mult, D]``
        before ``hc_head``; that is what MTP consumes). With ``batch.tail`` (:meth:`bounded_replay`), rows
        outside ``batch.tail.rows`` may hold the output of layer ``first_layer - 1`` instead; no logits
        row is among them."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` rows (as returned by :meth:`forward`) -> logits ``[L, vocab_size]`` float32."""

    def prepare_images(self, token_ids: list[int], images: list[object]) -> tuple[list[int], list]:
        """Image input: the prompt's ids with each image placeholder expanded into its image's span, and the
        spans (objects with ``start``, ``end``, ``image`` and ``digest``); called with no images too (a
        placeholder without its image is an error). Raises ``ValueError`` naming the problem. By default the
        model takes no images."""
        if not images:
            return list(token_ids), []
        raise ValueError(f"{type(self).__name__} takes no images")

    def encode_images(self, images: list) -> list[torch.Tensor]:
        """Each span's ``image`` -> its span embeddings ``[end - start, hidden]``; :meth:`forward` gets them as
        ``batch.image_rows`` / ``batch.image_embeds``."""
        raise NotImplementedError(f"{type(self).__name__} takes no images")

    #: :meth:`forward` with a :meth:`plan` in static mode has only static shapes and no host synchronisation,
    #: so a platform may capture decode steps as graphs
    supports_graphs: bool = False

    def plan(self, batch: ForwardBatch, context_bucket: int | None = None) -> object | None:
        """Host-side tables for ``batch`` (which is still on the host), moved to the device with it and read
        by :meth:`forward` as ``batch.plan``; ``None`` (the default): the model needs none. With
        ``context_bucket`` (only asked of models that set :attr:`supports_graphs`) the tables' shapes must
        depend only on the row count and the bucket, every context in the batch being below it."""
        return None

    #: :meth:`plan_on_device` builds a static step's plan on the device, so the runner may build it inside the
    #: captured step (``device_plan`` setting) instead of on the host every step
    device_plan: bool = False

    def plan_on_device(self, batch: ForwardBatch, context_bucket: int) -> object:
        """The static step's plan (what :meth:`plan` gives with ``context_bucket``) built where ``batch`` lives
        (the device) from its ``positions`` and ``block_tables``, with tensor ops only: no host
        synchronisation and no host checks, so a captured step holds it and its graph reads only
        ``input_ids``, ``positions`` and the block tables. The tables are ``context_bucket / block_size``
        columns wide. Asked only of models that set :attr:`device_plan`, and never with
        :meth:`prepare_static` work to do."""
        raise NotImplementedError(f"{type(self).__name__} builds no plan on the device")

    def prepare_static(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> None:
        """Called before each static target step (``batch`` on the device, with its plan): the step's work
        that a captured graph cannot hold (V4.1: reading its Engram rows from host memory), whose results
        go into ``batch.plan`` so that they are among ``plan.tensors()``, the graph's inputs. Default:
        nothing."""
        return None

    def bounded_replay(self) -> tuple[int, int] | None:
        """``(first_layer, window)`` when layers ``>= first_layer`` need only the last ``window`` rows of each
        request's chunk (V4.1: the decoder layers over their sliding window). With ``swa_bounded_replay`` on,
        the runner then gives mixed steps where rows can be dropped a ``batch.tail``
        (:class:`~deepinfer_core.models.batch.TailBatch`) and :meth:`forward` runs those layers on its rows
        only. The state those layers keep is then written on those rows only: it must be windowed (a
        window below ``window``), in cache groups of its own, and every cache spec names its ``writer``;
        the engine keeps it out of the prefix cache. ``None`` (the default): every layer runs on every
        row."""
        return None

    def plan_draft(self, batch: ForwardBatch, context_bucket: int | None = None) -> object | None:
        """:meth:`plan` for a draft step of the model's own draft modules (:meth:`mtp_forward`); by default
        the same tables."""
        return self.plan(batch, context_bucket)

    def mtp_forward(
        self, index: int, batch: ForwardBatch, prev_hidden: torch.Tensor, kv: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """One MTP draft step with module ``index``: row ``t`` is position ``batch.positions[t]``,
        ``batch.input_ids[t]`` the token *after* it and ``prev_hidden[t]`` the hidden state at it (from
        :meth:`forward` or from module ``index - 1``). Writes the module's own state (its cache specs are
        named ``mtp.{index}.*``) and returns its hidden states, same layout as :meth:`forward`'s."""
        raise NotImplementedError(f"{type(self).__name__} has no MTP module")

    def mtp_compute_logits(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of :meth:`mtp_forward`'s output -> draft logits ``[L, vocab_size]`` float32."""
        raise NotImplementedError(f"{type(self).__name__} has no MTP module")

    # DSpark (a block draft head reading per-layer taps of the target; see docs/spec_decode.md)

    def enable_dspark(self) -> None:
        """Turn the DSpark stages on; called before :meth:`cache_specs`. Afterwards :meth:`cache_specs` includes
        the stages' state and every row :meth:`forward` returns carries the target layers' taps after its
        hidden state (``[T, D + D * len(targets)]``; :meth:`compute_logits` reads the first ``D``)."""
        raise NotImplementedError(f"{type(self).__name__} has no DSpark stages")

    def dspark_context(self, batch: ForwardBatch, hidden: torch.Tensor, kv: dict[str, torch.Tensor]) -> None:
        """Write every stage's context state at ``batch.positions`` from :meth:`forward`'s rows ``hidden`` at
        those positions (``batch.plan`` from :meth:`plan_draft`)."""
        raise NotImplementedError(f"{type(self).__name__} has no DSpark stages")

    def dspark_block(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        """Draft blocks: row ``t`` of ``batch`` is a request's last computed position ``p`` and
        ``batch.input_ids[t]`` its next token ``y``; the block ``[y, noise, ...]`` at ``p + 1 ..`` runs through
        the stages -> ``[T, block, D]``, slot ``i`` the draft hidden of position ``p + 2 + i``."""
        raise NotImplementedError(f"{type(self).__name__} has no DSpark stages")

    def dspark_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of :meth:`dspark_block` ``[N, D]`` -> base draft logits ``[N, V]`` float32 (Markov bias not
        added)."""
        raise NotImplementedError(f"{type(self).__name__} has no DSpark stages")

    def dspark_markov(self, prev_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Markov head for previous tokens ``prev_ids [N]``: ``(logit bias [N, V] float32, embed [N, r])``."""
        raise NotImplementedError(f"{type(self).__name__} has no DSpark stages")

    def dspark_confidence(self, x: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        """The confidence head's raw score ``[N]`` of block rows ``x [N, D]`` with their Markov embeddings."""
        raise NotImplementedError(f"{type(self).__name__} has no DSpark stages")
