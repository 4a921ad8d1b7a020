"""Weight slots: each layer declares the tensors it expects and owns how a checkpoint tensor becomes its weight.

A :class:`Slot` is one named checkpoint tensor (DeepSeek's names, relative to the layer). Its
``weight_loader(tensor, scale)`` turns the stored tensor (and, for quantized linears, its scale companion)
into the runtime value. Layers subclass :class:`Module`; :meth:`Module.named_slots` walks the tree in
definition order, so the checkpoint loader stays generic: it only matches names, checks shapes and calls
``weight_loader``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch

from deepinfer_core.models.weight_checks import check_index_range
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.quant_formats import fp4_data_to_uint8, scale_to_float32
from deepinfer_core.ops.weights import QuantizedWeight, concat_rows

SlotKind = Literal["linear", "float32", "model", "index"]


class Slot:
    """One checkpoint tensor of logical ``shape``.

    Kinds: ``linear`` (an ``[out, in]`` matrix; BF16/FP32, or FP8 / FP4 with a scale companion, kept
    quantized), ``float32`` (norm weights, mHC parameters, sinks, biases: kept in float32 as V4 does),
    ``model`` (the model dtype) and ``index`` (integer tables such as ``tid2eid``, as int64).
    """

    def __init__(
        self,
        key: str,
        shape: tuple[int, ...],
        kind: SlotKind,
        loader: Callable[..., Any] | None = None,
        bounds: tuple[int, int] | None = None,
    ):
        self.key = key
        self.shape = tuple(shape)
        self.kind = kind
        self.value: Any = None
        self._custom = loader
        #: ``index`` slots: every id must lie in ``[low, high)``
        self.bounds = bounds

    def weight_loader(
        self, tensor: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, device: torch.device
    ) -> None:
        value = self.convert(tensor, scale, dtype, device)
        self.value = self._custom(value) if self._custom is not None else value

    def convert(
        self, tensor: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, device: torch.device
    ) -> Any:
        if self.kind == "float32":
            return tensor.to(device=device, dtype=torch.float32)
        if self.kind == "index":
            if self.bounds is not None:
                why = check_index_range(tensor, *self.bounds)
                if why:
                    raise ValueError(why)
            return tensor.to(device=device, dtype=torch.int64)
        if self.kind == "linear" and scale is not None:
            return quantized(tensor, scale, self.shape, device)
        return tensor.to(device=device, dtype=dtype)


def quantized(
    data: torch.Tensor, scale: torch.Tensor, shape: tuple[int, ...], device: torch.device
) -> QuantizedWeight:
    """A checkpoint's (data, scale) pair as a :class:`QuantizedWeight`: FP8 e4m3 data means 128x128 block
    scales, one-byte packed data (``float4_e2m1fn_x2`` / ``uint8`` / ``int8``) means FP4 e2m1."""
    s = scale_to_float32(scale).to(device)
    if data.dtype == torch.float8_e4m3fn:
        return QuantizedWeight(data=data.to(device), scale=s, format="fp8_block", shape=(shape[0], shape[1]))
    return QuantizedWeight(
        data=fp4_data_to_uint8(data).to(device), scale=s, format="fp4_e2m1", shape=(shape[0], shape[1])
    )


class SharedInput:
    """Linear slots that read the same input, run as one matrix (:func:`concat_rows`) where their formats allow
    it, else one by one. Built after load; the slots then hold row views of the fused matrix (no extra
    memory). Decode runs one GEMV per layer for ``wq_a`` + ``wkv`` instead of two, and one for the BF16
    compressor and indexer projections instead of up to five."""

    def __init__(self, slots: list[Slot]):
        self.slots = slots
        self.sizes = [s.value.shape[0] for s in slots]
        both = concat_rows([s.value for s in slots])
        self.fused = None if both is None else both[0]
        if both is not None:
            for s, view in zip(slots, both[1]):
                s.value = view

    def __call__(self, x: torch.Tensor, ops: Backends) -> list[torch.Tensor]:
        if self.fused is None:
            return [ops.dense.linear(x, s.value) for s in self.slots]
        return list(ops.dense.linear(x, self.fused).split(self.sizes, dim=-1))


class Module:
    """A layer: holds :class:`Slot` s, child modules and lists of child modules as attributes."""

    def named_slots(self, prefix: str = "") -> Iterator[tuple[str, Slot]]:
        for attr, v in vars(self).items():
            if isinstance(v, Slot):
                yield prefix + v.key, v
            elif isinstance(v, Module):
                yield from v.named_slots(f"{prefix}{attr}.")
            elif isinstance(v, list) and v and all(isinstance(m, Module) for m in v):
                for i, m in enumerate(v):
                    yield from m.named_slots(f"{prefix}{attr}.{i}.")

    def modules(self) -> Iterator[Module]:
        yield self
        for v in vars(self).values():
            if isinstance(v, Module):
                yield from v.modules()
            elif isinstance(v, list) and v and all(isinstance(m, Module) for m in v):
                for m in v:
                    yield from m.modules()

    def shared_inputs(self) -> Iterator[SharedInput]:
        """Every :class:`SharedInput` of the tree (built at ``post_load``): their fused matrices are the weights
        the GEMMs read, beside the slots' row views of them."""
        for m in self.modules():
            yield from (v for v in vars(m).values() if isinstance(v, SharedInput))

    def post_load(self) -> None:  # noqa: B027 - optional hook
        """Called once every slot of the tree is loaded (e.g. to assemble expert lists)."""
