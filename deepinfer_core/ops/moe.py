"""MoE ops: routing, expert computation, and (for expert parallelism) dispatch/combine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch

from deepinfer_core.ops.weights import ExpertWeights

ScoreFunc = Literal["sqrtsoftplus", "softmax", "sigmoid"]


class MoEOps(ABC):
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
