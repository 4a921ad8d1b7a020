"""Reference communication ops: torch.distributed with gloo, identity in a single process."""

from __future__ import annotations

import torch
import torch.distributed as dist

from deepinfer_core.ops.comm import CommOps


def _world(group: object | None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class ReferenceCommOps(CommOps):
    dist_backend = "gloo"

    def all_gather(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        n = _world(group)
        if n == 1:
            return x
        out = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(out, x.contiguous(), group=group)
        return torch.cat(out, dim=0)

    def all_reduce(self, x: torch.Tensor, group: object | None = None) -> torch.Tensor:
        if _world(group) > 1:
            dist.all_reduce(x, group=group)
        return x

    def all_to_all(
        self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: object | None = None
    ) -> torch.Tensor:
        if _world(group) == 1:
            return x
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        # gloo has no all_to_all_single with uneven splits on every build: exchange per peer.
        sends = list(x.contiguous().split(send_counts))
        recvs = list(out.split(recv_counts))
        dist.all_to_all(recvs, sends, group=group) if dist.get_backend(group) != "gloo" else _gloo_all_to_all(
            recvs, sends, group
        )
        return torch.cat(recvs, dim=0) if recvs else out


def _gloo_all_to_all(recvs: list[torch.Tensor], sends: list[torch.Tensor], group: object | None) -> None:
    rank = dist.get_rank(group)
    reqs = []
    for peer, t in enumerate(sends):
        if peer == rank:
            recvs[peer].copy_(t)
        else:
            reqs.append(dist.isend(t, dist.get_global_rank(group, peer) if group else peer, group=group))
    for peer, t in enumerate(recvs):
        if peer != rank:
            reqs.append(dist.irecv(t, dist.get_global_rank(group, peer) if group else peer, group=group))
    for r in reqs:
        r.wait()
