"""Reference communication ops: torch.distributed with gloo, identity in a single process.

Everything but the two primitives is :class:`~deepinfer_core.ops.comm.TorchDistributedCommOps`; these use
the list forms of the collectives, which every gloo build implements (not every build has
``all_to_all_single`` with uneven splits).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from deepinfer_core.ops.comm import TorchDistributedCommOps


class ReferenceCommOps(TorchDistributedCommOps):
    dist_backend = "gloo"

    def gather_into(self, out: torch.Tensor, x: torch.Tensor, group: object | None) -> None:
        dist.all_gather(list(out.view(dist.get_world_size(group), *x.shape).unbind(0)), x, group=group)

    def exchange_into(
        self,
        out: torch.Tensor,
        x: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        group: object | None,
    ) -> None:
        sends = list(x.split(send_counts))
        recvs = list(out.split(recv_counts))
        if dist.get_backend(group) != "gloo":
            dist.all_to_all(recvs, sends, group=group)
        else:
            _gloo_all_to_all(recvs, sends, group)


def _gloo_all_to_all(recvs: list[torch.Tensor], sends: list[torch.Tensor], group: object | None) -> None:
    """Exchange with each peer by point-to-point sends and receives."""
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
