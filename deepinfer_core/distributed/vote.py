"""The per-step DP vote: one small all-gather that keeps data-parallel ranks in lock step.

Every step each rank contributes ``[num_tokens, is_prefill, graph_ok, has_work]``. From the gathered
votes every rank takes the same decision: skip the step (nobody has work), or run it, ranks without
work running an empty batch so the MoE all-to-alls still meet. The tensor has a fixed shape, so a
device platform can capture the exchange in a graph.

A rank that died or hangs makes the collective fail or time out (the process group's ``timeout``);
the survivors then raise :class:`RankFailureError` naming the ranks that never reached this step,
found through per-step markers in the rendezvous store.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

VOTE_FIELDS = 4


class RankFailureError(RuntimeError):
    """Another rank died or timed out; the message names it (and ``ranks`` lists it, when known)."""

    def __init__(self, message: str, ranks: list[int] | None = None):
        super().__init__(message)
        self.ranks = list(ranks or [])


@dataclass(frozen=True)
class Vote:
    num_tokens: int
    is_prefill: bool
    graph_ok: bool
    has_work: bool

    def tensor(self) -> torch.Tensor:
        return torch.tensor(
            [self.num_tokens, self.is_prefill, self.graph_ok, self.has_work], dtype=torch.int64
        )


@dataclass(frozen=True)
class StepDecision:
    run: bool  # at least one rank has work: every rank runs (empty batches included)
    max_tokens: int  # the padded batch size a graph bucket must cover
    any_prefill: bool
    use_graph: bool  # every rank's step is graph-capturable


def decide(votes: torch.Tensor) -> StepDecision:
    """The common decision from ``votes [world, 4]``; identical on every rank by construction."""
    has_work = bool(votes[:, 3].any())
    return StepDecision(
        run=has_work,
        max_tokens=int(votes[:, 0].max()),
        any_prefill=bool(votes[:, 1].any()),
        use_graph=bool(votes[:, 2].all()) and not bool(votes[:, 1].any()),
    )


class DPVoter:
    """Exchanges votes over a process group; remembers the step number for failure diagnosis."""

    def __init__(self, group: object | None = None, store: dist.Store | None = None):
        self.group = group
        self.store = store
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.step = 0

    def exchange(self, vote: Vote) -> StepDecision:
        self.step += 1
        if self.store is not None:
            self.store.set(f"deepinfer/vote/{self.step}/{self.rank}", "1")
        out = [torch.empty(VOTE_FIELDS, dtype=torch.int64) for _ in range(self.world)]
        try:
            dist.all_gather(out, vote.tensor(), group=self.group)
        except Exception as exc:  # noqa: BLE001 - any transport error means a peer is gone
            raise RankFailureError(self._diagnose(exc)) from exc
        return decide(torch.stack(out))

    def _diagnose(self, exc: Exception) -> str:
        missing = []
        if self.store is not None:
            for r in range(self.world):
                try:
                    if not self.store.check([f"deepinfer/vote/{self.step}/{r}"]):
                        missing.append(r)
                except Exception:  # noqa: BLE001 - the store may be gone with rank 0
                    missing = []
                    break
        who = f"rank(s) {missing} did not reach" if missing else "a peer rank failed during"
        return f"data-parallel rank {self.rank}: {who} step {self.step}'s vote ({type(exc).__name__}: {exc})"
