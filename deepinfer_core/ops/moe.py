"""MoE ops: routing, expert computation, and (for expert parallelism) dispatch/combine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

import torch

from deepinfer_core.ops.weights import ExpertWeights

if TYPE_CHECKING:
    from deepinfer_core.ops.comm import CommOps

ScoreFunc = Literal["sqrtsoftplus", "softmax", "sigmoid"]


@dataclass
class EPRouting:
    """Where one MoE layer's experts live under expert parallelism (one rank's view).

    Physical slot ``s`` holds logical expert ``phy2log[s]`` and lives on rank ``s // slots_per_rank``;
    ``log2phy [E, max_replicas]`` (-1 padded) and ``logcnt [E]`` list each expert's replicas. ``load [E]``
    counts the (token, expert) pairs this rank routed since the last reset (EPLB statistics)."""

    rank: int
    world: int
    slots_per_rank: int
    log2phy: torch.Tensor
    logcnt: torch.Tensor
    group: object | None = None
    load: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))


@dataclass
class Dispatched:
    """What :meth:`MoEOps.dispatch` delivers to this rank: ``x [N, D]`` rows and the logical expert
    ``ids [N]`` each must go through, plus ``handle``, opaque to the caller, for :meth:`MoEOps.combine`."""

    x: torch.Tensor
    ids: torch.Tensor
    handle: object


class MoEOps(ABC):
    #: ``experts`` honours ``QuantizedWeight.act_block``: the gate / up input through the round trip, and the down
    #: projection's input scaled by the routing weight before its round trip (``activation_quant="fp8"``, 2.2)
    activation_quant: ClassVar[bool] = False

    @abstractmethod
    def route_topk(
        self,
        logits: torch.Tensor,
        correction_bias: torch.Tensor | None,
        top_k: int,
        score_func: ScoreFunc,
        routed_scaling_factor: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Learned routing. ``logits [T, E]`` float32.

        ``scores = score_func(logits)``; experts are chosen by top-k of ``scores + correction_bias``
        (the bias is for selection only); weights are the chosen ``scores`` normalised to sum 1 and
        multiplied by ``routed_scaling_factor``. Returns ``(weights [T, k] f32, ids [T, k] int64)``.
        """

    @abstractmethod
    def route_hash(
        self, logits: torch.Tensor, ids: torch.Tensor, score_func: ScoreFunc, routed_scaling_factor: float
    ) -> torch.Tensor:
        """Hash routing: experts are fixed (``ids [T, k]`` from ``tid2eid[input_ids]``); returns the
        normalised, scaled weights ``[T, k]`` f32 computed from ``score_func(logits)`` as in :meth:`route_topk`."""

    @abstractmethod
    def experts(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        experts: ExpertWeights,
        swiglu_limit: float,
    ) -> torch.Tensor:
        """Routed experts: ``out[t] = sum_j weights[t, j] * E_{ids[t, j]}(x[t])`` over the ``ids`` that
        are local (in ``experts.expert_ids``); others contribute nothing. ``E`` is the clamped SwiGLU of
        :meth:`DenseOps.swiglu_mlp`. ``x [T, D]`` -> ``[T, D]`` in ``x.dtype``."""

    # ------------------------------------------------------------------ expert parallelism (defaults)

    def dispatch(self, x: torch.Tensor, ids: torch.Tensor, ep: EPRouting, comm: CommOps) -> Dispatched:
        """Send each (token, top-k slot) pair to the rank holding a replica of its expert.

        ``x [T, D]``, ``ids [T, k]`` logical expert ids. Pair ``(t, j)`` goes to replica
        ``(t * k + j + rank) % logcnt[e]`` of its expert (spreads a hot expert over its replicas). Every
        rank must call this once per MoE layer per step, with ``T = 0`` on an idle rank. The default runs
        three variable-size all-to-alls on ``comm`` (counts, rows, ids); a platform may replace the pair
        with fused kernels (DeepEP-style) as long as :meth:`combine` returns the same sums."""
        t, k = ids.shape
        flat = ids.reshape(-1).long()
        pair = torch.arange(t * k, device=ids.device)
        replica = (pair + ep.rank) % ep.logcnt[flat].clamp_min(1)
        dest = ep.log2phy[flat, replica] // ep.slots_per_rank
        order = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=ep.world).tolist()
        ones = [1] * ep.world
        recv = comm.all_to_all(torch.tensor(send, dtype=torch.int64), ones, ones, ep.group).tolist()
        rows = comm.all_to_all(x[order // k].contiguous(), send, recv, ep.group)
        recv_ids = comm.all_to_all(flat[order].contiguous(), send, recv, ep.group)
        return Dispatched(rows, recv_ids, (order, send, recv, t, k))

    def combine(
        self,
        y: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        dispatched: Dispatched,
        ep: EPRouting,
        comm: CommOps,
    ) -> torch.Tensor:
        """Return expert outputs ``y [N, D]`` (rows of ``dispatched``, unweighted) to their tokens and sum
        ``out[t] = sum_j weights[t, j] * y_(t, j)``, -> ``[T, D]``. The default sums from zero in ascending
        ``(ids[t, j], j)`` order, the order of :meth:`experts`, so the result is bit-identical to the
        single-process layer."""
        order, send, recv, t, k = dispatched.handle
        back = comm.all_to_all(y.contiguous(), recv, send, ep.group)
        pairs = torch.empty((t * k, y.shape[-1]), dtype=y.dtype, device=y.device)
        pairs[order] = back
        out = torch.zeros((t, y.shape[-1]), dtype=y.dtype, device=y.device)
        for row in range(t):
            for j in sorted(range(k), key=lambda j: (int(ids[row, j]), j)):
                out[row] += pairs[row * k + j] * weights[row, j].to(y.dtype)
        return out
