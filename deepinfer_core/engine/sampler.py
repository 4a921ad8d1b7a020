"""Logits -> next tokens and logprobs, on ``backends.sampling``.

Per sampling row, in order: logit bias, ``min_tokens`` (EOS and stop tokens masked), the grammar bitmask
of structured-output requests, penalties, then
greedy rows take the argmax and the others draw from ``ops.probs`` with keyed randomness: the sequence's
sampling seed and the position of the token drawn (``ops.sample_keyed``, :mod:`deepinfer_core.ops.draws`),
so no generator state lives on the host and a whole batch draws in one launch. Reported logprobs are
the log-softmax of the *raw* logits, before any of that processing.

Two phases, so an overlapping engine never waits for the device inside a step: :meth:`Sampler.launch`
queues everything on the device (the tokens stay there, and a copy to the host is started) and returns
:class:`PendingSamples`; :meth:`PendingSamples.result` waits for that copy and builds the
:class:`SamplerOutput` (token ids, logprobs, prompt logprobs) on the host. :meth:`Sampler.sample` is both
at once. Draft verification and grammar checks read values on the host inside :meth:`launch`; the engine
runs those steps without overlap.

A constrained row whose grammar allows no token at all (an empty language, a dead end, or a grammar
backend that failed on it) cannot be sampled: its sequence is reported in :attr:`SamplerOutput.failed`
and whatever was drawn for it is discarded, so that request alone ends with an error.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

from deepinfer_core.engine.scheduler import ScheduledSeq, SchedulerOutput
from deepinfer_core.engine.sequence import Sequence
from deepinfer_core.models.batch import move_together
from deepinfer_core.ops.sampling import SamplingOps, SamplingTensors, cuts_used

#: (token id, logprob, rank) triples of one position; the output processor turns them into Logprob
RawLogprobs = list[tuple[int, float, int]]


@dataclass
class SamplerOutput:
    """Per scheduled sequence ``i`` (in ``SchedulerOutput.scheduled`` order)."""

    tokens: list[int | None]  # the sampled token, None where the step did not reach the end
    #: i -> (logprob of the sampled token, [sampled token, top-k...]) for requests that want logprobs
    logprobs: dict[int, tuple[float, RawLogprobs]] = field(default_factory=dict)
    #: i -> [(position + 1, logprobs)] prompt logprobs computed this step
    prompt: dict[int, list[tuple[int, RawLogprobs]]] = field(default_factory=dict)
    #: i -> tokens emitted by a draft round (accepted drafts + one), where ``tokens[i]`` is None
    spec: dict[int, list[int]] = field(default_factory=dict)
    #: i -> logprobs of each token in ``spec[i]`` for requests that want logprobs
    spec_logprobs: dict[int, list[tuple[float, RawLogprobs]]] = field(default_factory=dict)
    #: i -> why sequence ``i`` could not be sampled (its sample, if any, must be discarded)
    failed: dict[int, str] = field(default_factory=dict)


class PendingSamples:
    """A launched step's samples: the tokens on the device (``tokens[j]`` for scheduled sequence
    ``idx[j]``), their copy to the host under way, and what the host builds from them later."""

    def __init__(self, out: SamplerOutput):
        self.out = out
        self.idx: list[int] = []
        self.seqs: list[Sequence] = []
        self.tokens: torch.Tensor | None = None
        self.logprobs: tuple[list[int], torch.Tensor] | None = None  # (rows j, raw log-softmax rows)
        self.prompt: list[tuple[int, torch.Tensor, ScheduledSeq]] = []  # (i, logits rows, its step)
        self._host: torch.Tensor | None = None
        self._event: Any = None

    def start_copy(self, host_buffer: Any) -> None:
        """Queue the tokens' copy into a host buffer (``host_buffer(n)``: pinned where that matters)."""
        t = self.tokens
        if t.device.type == "cpu":
            self._host = t
            return
        self._host = host_buffer(t.shape[0])
        self._host.copy_(t, non_blocking=True)
        self._event = torch.Event(device=t.device)
        self._event.record()

    def result(self) -> SamplerOutput:
        """Wait for the copy (only) and fill in the tokens, logprobs and prompt logprobs."""
        out = self.out
        for i, rows, s in self.prompt:
            out.prompt[i] = _prompt_logprobs(rows, s)
        if self.tokens is None:
            return out
        if self._event is not None:
            self._event.synchronize()
        tokens = self._host.tolist()
        for i, t in zip(self.idx, tokens):
            out.tokens[i] = t
        if self.logprobs is not None:
            want, lp = self.logprobs
            for j, r in enumerate(want):
                top = _with_top(lp[j], tokens[r], self.seqs[r].params.logprobs)
                out.logprobs[self.idx[r]] = (top[0][1], top)
        return out


def _prompt_logprobs(logits: torch.Tensor, s: ScheduledSeq) -> list[tuple[int, RawLogprobs]]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    k, toks = s.seq.params.prompt_logprobs, s.seq.token_ids
    return [
        (p + 1, _with_top(lp[j], toks[p + 1], k))
        for j, p in enumerate(range(s.prompt_logprob_start, s.prompt_logprob_end))
    ]


def _select(p: SamplingTensors, rows: torch.Tensor) -> SamplingTensors:
    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[rows]

    return dataclasses.replace(
        p,
        temperature=p.temperature[rows],
        top_k=p.top_k[rows],
        top_p=p.top_p[rows],
        min_p=p.min_p[rows],
        seeds=pick(p.seeds),
        positions=pick(p.positions),
    )


class _DraftRow:
    """A sequence as seen at draft position ``j``: the earlier drafts count as outputs (penalties,
    ``min_tokens``)."""

    __slots__ = ("params", "token_ids", "num_prompt_tokens", "grammar_key", "output_token_ids")

    def __init__(self, seq: Sequence, drafts: list[int]):
        self.params, self.grammar_key = seq.params, seq.grammar_key
        self.token_ids, self.num_prompt_tokens = seq.token_ids, seq.num_prompt_tokens
        self.output_token_ids = seq.output_token_ids + drafts

    @property
    def num_sampled_outputs(self) -> int:
        return len(self.output_token_ids)


def _ranked(lp: torch.Tensor, ids: list[int]) -> RawLogprobs:
    vals = lp[ids]
    ranks = (lp[None, :] > vals[:, None]).sum(-1) + 1
    return list(zip(ids, vals.tolist(), ranks.tolist()))


def _with_top(lp: torch.Tensor, token: int, k: int) -> RawLogprobs:
    top = torch.topk(lp, k).indices.tolist() if k > 0 else []
    return _ranked(lp, [token] + [t for t in top if t != token])


def sampling_tensors(
    seqs: list[Any], device: torch.device | None = None, positions: list[int] | None = None
) -> SamplingTensors:
    """The rows' parameters; with ``positions`` (of the tokens drawn) also their keyed randomness."""
    p = [s.params for s in seqs]
    cuts = [cuts_used(q.top_k, q.top_p, q.min_p) for q in p]
    keyed = None
    if positions is not None:
        keyed = torch.tensor([[s.sampling_seed for s in seqs], positions], dtype=torch.int64, device=device)
    return SamplingTensors(
        temperature=torch.tensor([q.temperature for q in p], dtype=torch.float32, device=device),
        top_k=torch.tensor([q.top_k for q in p], dtype=torch.int64, device=device),
        top_p=torch.tensor([q.top_p for q in p], dtype=torch.float32, device=device),
        min_p=torch.tensor([q.min_p for q in p], dtype=torch.float32, device=device),
        any_top_k=any(c[0] for c in cuts),
        any_top_p=any(c[1] for c in cuts),
        any_min_p=any(c[2] for c in cuts),
        seeds=None if keyed is None else keyed[0],
        positions=None if keyed is None else keyed[1],
    )


def _draft_q(seq: Sequence, num_drafts: int, vocab: int) -> torch.Tensor | None:
    """The ``q`` of the drafts scheduled (a token budget may have cut them), or None for one-hot drafts."""
    q = seq.spec_token_probs
    if q is None:
        return None
    if q.shape[1] != vocab:
        raise ValueError(f"draft probs cover {q.shape[1]} tokens, the target's logits {vocab}")
    return q[:num_drafts]


def _rows_of(x: torch.Tensor, offsets: list[int], members: list[int]) -> tuple[torch.Tensor, list[int]]:
    """The rows of sequences ``members`` (``offsets``: row spans of all of them) and their new spans."""
    rows = [r for b in members for r in range(offsets[b], offsets[b + 1])]
    sizes = [offsets[b + 1] - offsets[b] for b in members]
    return (x if len(rows) == len(x) else x[rows]), list(itertools.accumulate(sizes, initial=0))


class Sampler:
    def __init__(
        self,
        ops: SamplingOps,
        eos_token_ids: list[int],
        vocab_size: int,
        structured: Any = None,
        spec_stats: Any = None,
    ):
        self.ops = ops
        self.spec_stats = spec_stats  # SpecStats: acceptance counters of draft rounds
        self.structured = structured  # StructuredOutputManager: grammar bitmasks
        self.eos = list(eos_token_ids)
        self.vocab_size = vocab_size
        #: ``n -> [n] int64`` host buffer the tokens are copied into (a platform's pinned buffer)
        self.host_buffer = lambda n: torch.empty(n, dtype=torch.int64)

    def sample(self, logits: torch.Tensor, sched: SchedulerOutput) -> SamplerOutput:
        return self.launch(logits, sched).result()

    def launch(
        self, logits: torch.Tensor, sched: SchedulerOutput, params: SamplingTensors | None = None
    ) -> PendingSamples:
        """Queue the step's sampling on the device. ``params``: the sampling parameters of the rows that
        sample (the persistent batch's), else built from the sequences."""
        out = SamplerOutput([None] * len(sched.scheduled))
        pending = PendingSamples(out)
        rows, idx, row_ids, spec = 0, [], [], []
        for i, s in enumerate(sched.scheduled):
            n = s.prompt_logprob_end - s.prompt_logprob_start
            if n:
                pending.prompt.append((i, logits[rows : rows + n], s))
                rows += n
            if s.samples and s.num_drafts:
                spec.append((i, rows))
                rows += 1 + s.num_drafts
            elif s.samples:
                idx.append(i)
                row_ids.append(rows)
                rows += 1
        if idx:
            if len(row_ids) == len(logits):
                x = logits
            else:  # (an index tensor copied without blocking: a list index would wait for the device)
                x = logits.index_select(0, move_together([torch.tensor(row_ids)], logits.device)[0])
            seqs = [sched.scheduled[i].seq for i in idx]
            pending.idx, pending.seqs = idx, seqs
            positions = [sched.scheduled[i].end for i in idx]  # of the tokens drawn
            pending.tokens = self._sample_rows(x, seqs, idx, out, params, positions)
            want = [j for j, s in enumerate(seqs) if s.params.logprobs is not None]
            if want:
                pending.logprobs = (want, torch.log_softmax(x[want].float(), dim=-1))
            pending.start_copy(self.host_buffer)
        if spec:
            self._verify(logits, spec, sched, out)
        return pending

    def _sample_rows(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        idx: list[int],
        out: SamplerOutput,
        params: SamplingTensors | None = None,
        positions: list[int] | None = None,
    ) -> torch.Tensor:
        """The sampled token of each row, ``[len(seqs)]`` int64 on the device (nothing read back).
        ``positions``: where each row's token goes (its draw is keyed there)."""
        x, dead = self._process(logits, seqs)
        for r, why in dead.items():
            out.failed[idx[r]] = why
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        if len(greedy) == len(seqs):
            return self.ops.argmax(x)
        if params is None or params.seeds is None:
            params = sampling_tensors(seqs, x.device, positions)
        if not greedy:
            return self._random(x, params)
        rand = [i for i, s in enumerate(seqs) if not s.params.greedy]
        dev = x.device
        tokens = torch.empty(len(seqs), dtype=torch.int64, device=dev)
        g, r = move_together([torch.tensor(greedy), torch.tensor(rand)], dev)
        tokens[g] = self.ops.argmax(x.index_select(0, g))
        tokens[r] = self._random(x.index_select(0, r), _select(params, r))
        return tokens

    def _verify(
        self, logits: torch.Tensor, items: list[tuple[int, int]], sched: SchedulerOutput, out
    ) -> None:
        """Draft rounds: sequence ``i`` owns logits rows ``start .. start + d``, row ``j`` conditioned on
        its drafts ``0..j-1``; all rounds are processed and verified together."""
        from deepinfer_core.spec_decode import verify

        seqs, drafts, rows, views, keys = [], [], [], [], []
        for i, start in items:
            seq = sched.scheduled[i].seq
            d = seq.spec_token_ids[: sched.scheduled[i].num_drafts]
            seqs.append(seq)
            drafts.append(d)
            rows.extend(range(start, start + len(d) + 1))
            views.extend(_DraftRow(seq, d[:j]) for j in range(len(d) + 1))
            keys.append(seq.grammar_key or f"\0spec/{seq.seq_id}")  # unknown keys: all-ones rows
        raw = logits[rows]
        x, dead = self._process(raw, views, keys, dict(zip(keys, drafts)))
        offsets = list(itertools.accumulate((len(d) + 1 for d in drafts), initial=0))
        for r, why in dead.items():
            out.failed[items[bisect.bisect_right(offsets, r) - 1][0]] = why
        tokens: list[list[int]] = [[] for _ in seqs]
        greedy = [b for b, q in enumerate(seqs) if q.params.greedy]
        rand = [b for b, q in enumerate(seqs) if not q.params.greedy]
        if greedy:
            part, offs = _rows_of(x, offsets, greedy)
            for b, t in zip(greedy, verify.verify_greedy(self.ops, part, offs, [drafts[b] for b in greedy])):
                tokens[b] = t
        if rand:
            first = [
                sched.scheduled[i].end - sched.scheduled[i].num_drafts for i, _ in items
            ]  # draft 0's position
            for b, t in zip(rand, self._verify_sampled(x, offsets, views, seqs, drafts, rand, first)):
                tokens[b] = t
        for b, ((i, _), seq) in enumerate(zip(items, seqs)):
            if self.spec_stats is not None:
                self.spec_stats.record(len(drafts[b]), len(tokens[b]) - 1)
            out.spec[i] = tokens[b]
            if seq.params.logprobs is not None:
                lp = torch.log_softmax(raw[offsets[b] : offsets[b] + len(tokens[b])].float(), dim=-1)
                tops = [_with_top(lp[j], t, seq.params.logprobs) for j, t in enumerate(tokens[b])]
                out.spec_logprobs[i] = [(top[0][1], top) for top in tops]

    def _verify_sampled(
        self,
        x: torch.Tensor,
        offsets: list[int],
        views: list[_DraftRow],
        seqs: list[Sequence],
        drafts: list[list[int]],
        rand: list[int],
        first: list[int],
    ) -> list[list[int]]:
        """Sampled rounds of sequences ``rand``: ``p`` is each row's distribution exactly as plain sampling
        takes it; drafts with a proposer's ``q`` go to rejection sampling on ``q``, the others (one-hot
        ``q``) to the draws of plain sampling."""
        from deepinfer_core.spec_decode import verify

        part, offs = _rows_of(x, offsets, rand)
        rows_params = [views[r] for b in rand for r in range(offsets[b], offsets[b + 1])]
        p = self.ops.probs(part, sampling_tensors(rows_params, x.device))
        seeds = [seqs[b].sampling_seed for b in rand]
        at = [first[b] for b in rand]
        qs = [_draft_q(seqs[b], len(drafts[b]), x.shape[1]) for b in rand]
        with_q = [a for a, q in enumerate(qs) if q is not None]
        one_hot = [a for a, q in enumerate(qs) if q is None]
        out: list[list[int]] = [[] for _ in rand]
        if one_hot:
            sub, sub_offs = _rows_of(p, offs, one_hot)
            d, s, pos = (
                [drafts[rand[a]] for a in one_hot],
                [seeds[a] for a in one_hot],
                [at[a] for a in one_hot],
            )
            for a, t in zip(one_hot, verify.verify_sampled(self.ops, sub, sub_offs, d, s, pos)):
                out[a] = t
        if with_q:
            sub, sub_offs = _rows_of(p, offs, with_q)
            d, s, pos = [drafts[rand[a]] for a in with_q], [seeds[a] for a in with_q], [at[a] for a in with_q]
            q = [qs[a] for a in with_q]
            for a, t in zip(with_q, verify.verify_with_probs(self.ops, sub, sub_offs, d, q, s, pos)):
                out[a] = t
        return out

    def _random(self, x: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        probs = self.ops.probs(x, params)
        return self.ops.sample_keyed(probs, params.seeds, params.positions)

    def _process(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        keys: list[str | None] | None = None,
        drafts: dict[str, list[int]] | None = None,
    ) -> tuple[torch.Tensor, dict[int, str]]:
        """Logit bias, min_tokens masking and penalties; returns new logits (float32) and the rows that
        cannot be sampled (row -> why). ``keys`` and ``drafts``: grammar keys owning the rows when they
        are draft rows (see ``fill_bitmask``)."""
        x = logits.float()
        touched = False
        for i, s in enumerate(seqs):
            prm = s.params
            if prm.logit_bias or s.num_sampled_outputs < prm.min_tokens:
                if not touched:
                    x, touched = x.clone(), True
                if prm.logit_bias:
                    ids = torch.tensor(list(prm.logit_bias), device=x.device)
                    x[i, ids] += torch.tensor(list(prm.logit_bias.values()), device=x.device)
                if s.num_sampled_outputs < prm.min_tokens:
                    banned = set(prm.stop_token_ids) | (set() if prm.ignore_eos else set(self.eos))
                    if banned:
                        x[i, list(banned)] = float("-inf")
        dead: dict[int, str] = {}
        if self.structured is not None and len(self.structured):
            owners = keys or [s.grammar_key for s in seqs]
            mask = self.structured.fill_bitmask(owners, drafts)
            if mask is not None:
                x = self._apply_grammar(x, logits, mask)
                dead = self._dead_rows(x, owners)
                touched = True
        pen = [i for i, s in enumerate(seqs) if s.params.has_penalties]
        if pen:
            x = x.clone() if not touched else x
            x[pen] = self._penalties(x[pen], [seqs[i] for i in pen])
        return x, dead

    def _apply_grammar(self, x: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        masked = self.ops.apply_bitmask(x, mask.to(x.device))
        # The grammar wins over min_tokens: where it allows only a stop token that min_tokens banned,
        # the row would have no finite logit; mask the unbanned logits instead.
        empty = torch.isinf(masked).all(dim=-1).nonzero().flatten().tolist()
        if empty:
            masked[empty] = self.ops.apply_bitmask(logits[empty].float(), mask[empty].to(x.device))
        return masked

    def _dead_rows(self, x: torch.Tensor, owners: list[str | None]) -> dict[int, str]:
        """Rows with no finite logit even after the fallback: their grammar allows no token at all."""
        rows = torch.isinf(x).all(dim=-1).nonzero().flatten().tolist()
        out = {}
        for r in rows:
            key = owners[r]
            if key is not None and self.structured.is_constrained(key):
                out[r] = self.structured.failure(key) or (
                    "its structured-output grammar allows no next token (an empty language or a dead end)"
                )
        return out

    def _penalties(self, x: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        b, v, dev = x.shape[0], x.shape[1], x.device
        prompt_mask = torch.zeros(b, v, dtype=torch.bool, device=dev)
        counts = torch.zeros(b, v, dtype=torch.int64, device=dev)
        for i, s in enumerate(seqs):
            prompt_mask[i, torch.tensor(s.token_ids[: s.num_prompt_tokens], device=dev)] = True
            out_ids = s.output_token_ids
            if out_ids:
                counts[i].scatter_add_(
                    0,
                    torch.tensor(out_ids, device=dev),
                    torch.ones(len(out_ids), dtype=torch.int64, device=dev),
                )
        f32 = dict(dtype=torch.float32, device=dev)
        return self.ops.apply_penalties(
            x,
            prompt_mask,
            counts,
            torch.tensor([s.params.presence_penalty for s in seqs], **f32),
            torch.tensor([s.params.frequency_penalty for s in seqs], **f32),
            torch.tensor([s.params.repetition_penalty for s in seqs], **f32),
        )
