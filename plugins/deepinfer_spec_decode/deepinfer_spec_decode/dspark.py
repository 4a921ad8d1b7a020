"""DSpark drafting: V4.1's block draft head (``mtp.*`` stages) on the target's per-layer taps.

``speculative_config={"method": "dspark", "num_speculative_tokens": k}`` with ``1 <= k <= dspark_block_size``.
The factory turns the model's DSpark stages on (:meth:`CausalLM.enable_dspark`), so the target's hidden rows
carry the target layers' taps and the stages' window caches are allocated.

After every target step (:meth:`DSparkProposer.observe`) every stage's window KV is written at every row the
step verified (prompt chunks, the accepted prefix and the last verified token), from those rows' taps: rejected
draft positions are never written, and a later step's writes cover them, so the windows only ever hold the
context. The engine shows every step; should a decoding sequence's rows ever start past what the stages hold
(a step not shown), the positions in between are a hole in the windows, and the sequence drafts nothing (plain
steps, still exact) until the hole is rewritten or has left the window. A round (:meth:`DSparkProposer.propose`) is one draft step per round, whatever ``k``: the block
``[y, noise, ...]`` (``y`` the sequence's last, uncomputed token) at the positions after the last computed one
runs through all stages at once (:meth:`CausalLM.dspark_block`), writing nothing; its ``block_size`` slots
give the base logits of the next ``block_size`` drafts. The Markov head then makes drafting sequential over
the slots: slot ``i`` adds the bias of the token before it (``y``, then the drafts).

Greedy requests draft the argmax (one-hot ``q``). Sampling requests (``draft_sampling="sample"``, the default)
draw each draft with the sequence's draft generator from the request's distribution over that slot's logits
(Markov bias included) and return it as ``q`` (:class:`Draft`): the verifier's rejection sampling is lossless.
``draft_sampling="greedy"`` drafts the argmax for every request. ``confidence_threshold`` (optional, in
``(0, 1)``) ends a block at the first slot whose confidence head gives ``sigmoid(score) <`` the threshold;
DeepSeek's release does not say how the score is used, so it is off by default.
"""

from __future__ import annotations

from typing import Any

import torch

from deepinfer_core.plugin_api import (
    ConfigError,
    Draft,
    DraftSequence,
    ForwardBatch,
    Proposer,
    ProposerContext,
    VerifiedRows,
)
from deepinfer_spec_decode.mtp import _layout


class DSparkProposer(Proposer):
    needs_hidden = True

    def __init__(
        self, model: Any, k: int, sample_drafts: bool = True, confidence_threshold: float | None = None
    ):
        self.model, self.num_speculative_tokens = model, k
        self.sample_drafts, self.confidence_threshold = sample_drafts, confidence_threshold
        #: seq_id -> positions whose context the stages hold (0 .. n - 1)
        self._written: dict[int, int] = {}
        #: seq_id -> ``(first, end)``: positions a step verified but :meth:`observe` never saw; the stages'
        #: windows miss them, so the sequence drafts nothing until they are overwritten or out of the window
        self._holes: dict[int, tuple[int, int]] = {}
        self.window = model.cfg.sliding_window

    def bind(self, ctx: ProposerContext) -> None:
        self.ctx = ctx

    def observe(self, rows: list[VerifiedRows]) -> None:
        """Every stage's window at the rows the last step verified."""
        hidden = self.ctx.last_hidden()
        if hidden is None or not rows:
            return
        ids = [[0] * r.num_verified for r in rows]  # the context step reads positions and taps, not ids
        batch = self.ctx.draft_batch([r.seq for r in rows], [r.start for r in rows], ids)
        n_rows = batch.input_ids.shape[0]
        q = n_rows // max(batch.query_start_loc.shape[0] - 1, 1) if batch.graph_key is not None else None
        src = [r.row + j for r in rows for j in range(r.num_verified)]
        gather, _ = _layout(src, [r.num_verified for r in rows], n_rows, q)
        taps = hidden.index_select(0, torch.tensor(gather, dtype=torch.int64, device=hidden.device))
        self.ctx.run("dspark.context", self._context_step, batch, taps)
        for r in rows:
            sid, end = r.seq.seq_id, r.start + r.num_verified
            held = self._written.get(sid)
            if held is not None and r.start > held:  # rows held .. start - 1 were never shown (a gap)
                self._holes[sid] = (held, r.start)
            hole = self._holes.get(sid)
            if hole is not None and r.start <= hole[0] and end >= hole[1]:  # written now (a recompute)
                del self._holes[sid]
            self._written[sid] = end

    def propose(self, seqs: list[DraftSequence], limits: list[int]) -> list[list[int] | Draft]:
        live = {s.seq_id for s in seqs}
        self._written = {sid: n for sid, n in self._written.items() if sid in live}
        self._holes = {sid: h for sid, h in self._holes.items() if sid in live}
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [i for i, s in enumerate(seqs) if self._written.get(s.seq_id) == s.num_computed]
        # the block's rows read the window of positions num_computed - window .. num_computed - 1
        active = [i for i in active if self._clear_of_holes(seqs[i])]
        if not active:
            return list(drafts)
        chosen = [seqs[i] for i in active]
        batch = self.ctx.draft_batch(
            chosen, [s.num_computed - 1 for s in chosen], [[s.token_ids[-1]] for s in chosen]
        )
        x, base = self.ctx.run("dspark.block", self._block_step, batch)
        x, base = x[: len(active)], base[: len(active)]
        q: list[list[torch.Tensor]] = [[] for _ in seqs]
        prev = [seqs[i].token_ids[-1] for i in active]
        open_ = list(range(len(active)))  # rows of `active` still drafting
        for slot in range(max(limits[i] for i in active)):
            open_ = [a for a in open_ if limits[active[a]] > slot]
            if not open_:
                break
            prev_t = torch.tensor([prev[a] for a in open_], dtype=torch.int64, device=base.device)
            bias, embed = self.model.dspark_markov(prev_t)
            if self.confidence_threshold is not None:
                score = self.model.dspark_confidence(x[open_, slot], embed)
                keep = (torch.sigmoid(score) >= self.confidence_threshold).tolist()
                open_ = [a for a, ok in zip(open_, keep) if ok]
                bias = bias[[j for j, ok in enumerate(keep) if ok]]
                if not open_:
                    break
            tokens = self._pick(seqs, [active[a] for a in open_], base[open_, slot] + bias, slot, q)
            for a, t in zip(open_, tokens):
                drafts[active[a]].append(t)
                prev[a] = t
        return [Draft(d, torch.stack(qi)) if qi else d for d, qi in zip(drafts, q)]

    def _clear_of_holes(self, seq: DraftSequence) -> bool:
        hole = self._holes.get(seq.seq_id)
        return hole is None or seq.num_computed - self.window >= hole[1]

    def _pick(
        self,
        seqs: list[DraftSequence],
        rows: list[int],
        logits: torch.Tensor,
        slot: int,
        q: list[list[torch.Tensor]],
    ) -> list[int]:
        """Slot ``slot``'s draft of each sequence ``seqs[rows[a]]`` from its logits (row ``a``): the argmax, or for a
        sampling request (with ``sample_drafts``) a draw from the request's distribution, whose row goes to ``q``."""
        tokens = torch.argmax(logits, dim=-1).tolist()
        sampled = [a for a, i in enumerate(rows) if self.sample_drafts and not seqs[i].params.greedy]
        if not sampled:
            return tokens
        who = [seqs[rows[a]] for a in sampled]
        probs = self.ctx.draft_probs(who, logits[sampled])
        for a, t, row in zip(sampled, self.ctx.draw(who, probs), probs):
            tokens[a] = t
            q[rows[a]].append(row)
        return tokens

    def _context_step(self, batch: ForwardBatch, taps: torch.Tensor) -> tuple[torch.Tensor]:
        self.model.dspark_context(batch, taps, self.ctx.pools())
        return (taps[:0],)

    def _block_step(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.model.dspark_block(batch, self.ctx.pools())
        return x, self.model.dspark_logits(x.flatten(0, 1)).view(*x.shape[:2], -1)


def make_dspark(model: Any, spec: dict[str, Any], config: Any) -> DSparkProposer:
    block = getattr(model, "dspark_block_size", 0)
    if not getattr(model, "num_dspark_stages", 0) or not block:
        raise ConfigError(
            "speculative_config.method='dspark' needs DSpark weights, but the model has no DSpark stages "
            "(a DeepSeek-V4.1 checkpoint with mtp.* tensors and dspark_block_size > 0); use method 'mtp' or "
            "'ngram' for this model"
        )
    k = spec["num_speculative_tokens"]
    if k > block:
        raise ConfigError(
            f"speculative_config.num_speculative_tokens={k} is invalid for method 'dspark': the draft block has "
            f"{block} tokens (dspark_block_size), so it must be in 1..{block}"
        )
    mode = spec.get("draft_sampling", "sample")
    if mode not in ("sample", "greedy"):
        raise ConfigError(f"speculative_config.draft_sampling={mode!r} is invalid: 'sample' or 'greedy'")
    threshold = spec.get("confidence_threshold")
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0 < threshold < 1):
        raise ConfigError(
            f"speculative_config.confidence_threshold={threshold!r} is invalid: a number in (0, 1), or absent"
        )
    model.enable_dspark()
    return DSparkProposer(model, k, sample_drafts=mode == "sample", confidence_threshold=threshold)
