"""Reference sampling ops: plain PyTorch, every row computed independently of the others. ``sample_keyed`` is
the core's definition (:func:`deepinfer_core.ops.draws.draw`); ``rejection_sample_keyed`` walks each row's drafts
one at a time."""

from __future__ import annotations

import torch

from deepinfer_core.ops import draws
from deepinfer_core.ops.sampling import SamplingOps, SamplingTensors


def _draw(p: torch.Tensor, seed: int, position: int) -> int:
    """One token from the weights ``p [V]``, keyed at ``(seed, position)`` (:func:`draws.draw`)."""
    return int(draws.draw(p[None], torch.tensor([seed]), torch.tensor([position]))[0])


def _accept_uniform(seed: int, position: int) -> float:
    """The acceptance uniform of the draft at ``position`` (float64, as the test ``u * q < p`` is)."""
    return float(draws.uniforms(torch.tensor([seed]), torch.tensor([position]), draws.ACCEPT)[0])


class ReferenceSamplingOps(SamplingOps):
    def apply_penalties(self, logits, prompt_mask, output_counts, presence, frequency, repetition):
        out = logits.clone()
        seen = prompt_mask | (output_counts > 0)
        rep = repetition[:, None].expand_as(out)
        penalised = torch.where(out > 0, out / rep, out * rep)
        out = torch.where(seen, penalised, out)
        counts = output_counts.to(out.dtype)
        out = out - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(out.dtype)
        return out

    def probs(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        logits = logits.float()
        greedy = params.temperature <= 0
        t = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
        x = logits / t[:, None]
        k = params.top_k
        if bool((k > 0).any()):
            x = self._top_k(x, k)
        p = torch.softmax(x, dim=-1)
        if bool((params.top_p < 1).any()):
            p = self._top_p(p, params.top_p)
        if bool((params.min_p > 0).any()):
            keep = p >= params.min_p[:, None] * p.amax(dim=-1, keepdim=True)
            p = torch.where(keep, p, torch.zeros_like(p))
            p = p / p.sum(dim=-1, keepdim=True)
        if bool(greedy.any()):
            onehot = torch.zeros_like(p).scatter_(1, self.argmax(logits)[:, None], 1.0)
            p = torch.where(greedy[:, None], onehot, p)
        return p

    @staticmethod
    def _top_k(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        v = x.shape[-1]
        kk = torch.where(k > 0, k.clamp(max=v), torch.full_like(k, v))
        sorted_x = torch.sort(x, dim=-1, descending=True).values
        thresh = sorted_x.gather(1, (kk - 1)[:, None])
        return torch.where(x >= thresh, x, torch.full_like(x, float("-inf")))

    @staticmethod
    def _top_p(p: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        # stable sort on -p orders equal probabilities by token id
        order = torch.sort(-p, dim=-1, stable=True).indices
        sp = p.gather(1, order)
        before = torch.cumsum(sp, dim=-1) - sp  # mass of the strictly more likely tokens
        # top_p >= 1 disables the cut (else rounding of the running sum to 1.0 drops the tail, and a row's
        # result would depend on whether another row of its batch has top_p < 1)
        keep_sorted = (before < top_p[:, None]) | (top_p[:, None] >= 1)
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
        p = torch.where(keep, p, torch.zeros_like(p))
        return p / p.sum(dim=-1, keepdim=True)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.argmax(logits, dim=-1)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        ids = torch.arange(v, device=logits.device)
        words = bitmask.to(torch.int64)[:, ids // 32]
        allowed = ((words >> (ids % 32)) & 1).bool()
        return logits.masked_fill(~allowed, float("-inf"))

    def rejection_sample_keyed(self, draft_ids, draft_probs, target_probs, seeds, positions):
        b, k = draft_ids.shape
        tokens = torch.full((b, k + 1), -1, dtype=torch.int64, device=draft_ids.device)
        accepted = torch.zeros(b, dtype=torch.int64, device=draft_ids.device)
        for r in range(b):
            row, n = self._verify_row(
                r, draft_ids, draft_probs, target_probs, int(seeds[r]), int(positions[r])
            )
            tokens[r, : len(row)] = torch.tensor(row, dtype=torch.int64)
            accepted[r] = n
        return tokens, accepted

    @staticmethod
    def _verify_row(r, draft_ids, draft_probs, target_probs, seed, pos) -> tuple[list[int], int]:
        """Row ``r``, one draft at a time: the acceptance uniform and the race of each position keyed as
        :meth:`SamplingOps.rejection_sample_keyed` says."""
        k = draft_ids.shape[1]
        out: list[int] = []
        for j in range(k):
            d = int(draft_ids[r, j])
            p = target_probs[r, j].float().cpu()
            q = draft_probs[r, j].float().cpu() if draft_probs is not None else None
            qd = float(q[d]) if q is not None else 1.0
            if _accept_uniform(seed, pos + j) * qd < float(p[d]):  # accept with probability min(1, p/q)
                out.append(d)
                continue
            if q is None:
                resid = p.clone()
                resid[d] = 0.0
            else:
                resid = (p - q).clamp_min(0.0)
            out.append(_draw(resid if float(resid.sum()) > 0 else p, seed, pos + j))
            return out, j
        out.append(_draw(target_probs[r, k].float().cpu(), seed, pos + k))
        return out, k
