"""Sampled tokens -> sequence state (tokens, logprobs, text), stop checks, and ``RequestOutput``s.

Stop rules, checked after each new token in this order: EOS (unless ``ignore_eos``) and
``stop_token_ids`` end with ``finish_reason="stop"`` and do not add text (the token stays in
``token_ids``); a stop string found in the detokenized text (across token boundaries, once
``min_tokens`` are out) ends it and is cut from the text unless ``include_stop_str_in_output``;
``max_tokens`` or ``max_model_len`` end it with ``"length"``; a structured-output grammar that accepts a
stop token ends it with ``"stop"``.
"""

from __future__ import annotations

import time
from typing import Any

from deepinfer_core.engine.detokenizer import find_stop, make_detokenizer
from deepinfer_core.engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from deepinfer_core.engine.sampler import RawLogprobs, SamplerOutput
from deepinfer_core.engine.scheduler import SchedulerOutput
from deepinfer_core.engine.sequence import Request, SeqStatus, Sequence


def _tail(pieces: list[str], n: int) -> str:
    """The last (at least) ``n`` characters of ``"".join(pieces)``."""
    out, size = [], 0
    for p in reversed(pieces):
        out.append(p)
        size += len(p)
        if size >= n:
            break
    return "".join(reversed(out))


class OutputProcessor:
    def __init__(self, tokenizer: Any, eos_token_ids: list[int], max_model_len: int, structured: Any = None):
        self.tokenizer = tokenizer
        self.structured = structured
        self.eos = set(eos_token_ids)
        self.max_model_len = max_model_len
        self._detok: dict[int, Any] = {}
        self._piece: dict[int, str] = {}

    def append(
        self, sched: SchedulerOutput, samples: SamplerOutput
    ) -> tuple[list[Sequence], list[tuple[Sequence, str]]]:
        """Record each sample; returns the sequences that finished this step, and those that failed with
        why (their sample discarded, or their processing raised: each fails alone)."""
        now = time.perf_counter()
        finished, failed = [], []
        for i, pl in samples.prompt.items():
            self._prompt_logprobs(sched.scheduled[i].seq.request, pl)
        for i, (s, tok) in enumerate(zip(sched.scheduled, samples.tokens)):
            if tok is None and i not in samples.spec:
                continue
            seq = s.seq
            if i in samples.failed:
                failed.append((seq, samples.failed[i]))
                continue
            m = seq.request.metrics
            if m.first_token_time is None:
                m.first_token_time = now - m.arrival_time
            try:
                self._record(seq, i, tok, samples)
            except Exception as exc:  # noqa: BLE001 - e.g. a grammar library failing on this request
                failed.append((seq, f"processing its output raised {type(exc).__name__}: {exc}"))
                continue
            if seq.finish_reason is not None:
                seq.status = SeqStatus.FINISHED
                self.forget(seq)
                finished.append(seq)
        return finished, failed

    def _record(self, seq: Sequence, i: int, tok: int | None, samples: SamplerOutput) -> None:
        if tok is not None:
            self._append_one(seq, tok, samples.logprobs.get(i))
            return
        lps = samples.spec_logprobs.get(i)  # a draft round: stop at the first token that finishes it
        for j, t in enumerate(samples.spec[i]):
            self._append_one(seq, t, lps[j] if lps else None)
            if seq.finish_reason is not None:
                break

    def _append_one(self, seq: Sequence, tok: int, lp: tuple[float, RawLogprobs] | None) -> None:
        self._append(seq, tok, lp)
        if seq.grammar_key is not None and self.structured.accept(seq.grammar_key, (tok,)):
            seq.finish_reason = seq.finish_reason or "stop"  # the grammar accepted a stop token

    def _prompt_logprobs(self, req: Request, entries: list[tuple[int, RawLogprobs]]) -> None:
        for pos, raw in entries:
            assert pos == len(req.prompt_logprobs), "prompt logprobs out of order"
            req.prompt_logprobs.append(self._logprobs(raw))

    def _append(self, seq: Sequence, tok: int, lp: tuple[float, RawLogprobs] | None) -> None:
        prm = seq.params
        seq.token_ids.append(tok)
        if seq.logprobs is not None:
            seq.logprobs.append(self._logprobs(lp[1]))
            seq.cumulative_logprob += lp[0]
        if tok in self.eos and not prm.ignore_eos:
            seq.finish_reason = "stop"
        elif prm.stop_token_ids and tok in prm.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", tok
            if prm.include_stop_str_in_output:
                self._add_text(seq, tok)
        else:
            self._add_text(seq, tok)
        if seq.finish_reason is None and (
            seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            seq.finish_reason = "length"

    def _add_text(self, seq: Sequence, tok: int) -> None:
        if self.tokenizer is None:
            return
        seq.num_text_tokens += 1
        if not seq.params.stop:  # nothing to match: decode once when the request finishes
            return
        det = self._detok.get(seq.seq_id)
        if det is None:
            det = self._detok[seq.seq_id] = make_detokenizer(
                self.tokenizer, seq.token_ids[: seq.num_prompt_tokens], seq.params.skip_special_tokens
            )
        new = det.add(tok)
        if not new:
            return
        seq.text_pieces.append(new)
        prm = seq.params
        if not prm.stop or seq.num_output_tokens < prm.min_tokens:
            return
        tail = _tail(seq.text_pieces, len(new) + max(len(x) for x in prm.stop) - 1)
        hit = find_stop(tail, len(new), prm.stop)
        if hit is not None:
            i, stop = hit
            text = seq.text
            cut = len(text) - len(tail) + i
            seq.text_pieces = [text[: cut + len(stop)] if prm.include_stop_str_in_output else text[:cut]]
            seq.finish_reason, seq.stop_reason = "stop", stop

    def _logprobs(self, raw: RawLogprobs) -> PositionLogprobs:
        return {t: Logprob(lp, rank, self._decode_piece(t)) for t, lp, rank in raw}

    def _decode_piece(self, tok: int) -> str | None:
        if self.tokenizer is None:
            return None
        piece = self._piece.get(tok)
        if piece is None:
            piece = self._piece[tok] = self.tokenizer.decode([tok], skip_special_tokens=False)
        return piece

    def forget(self, seq: Sequence) -> None:
        """Drop per-sequence state (detokenizer, grammar) of a finished or aborted sequence."""
        self._detok.pop(seq.seq_id, None)
        if seq.grammar_key is not None:
            self.structured.free(seq.grammar_key)

    def _final_text(self, seq: Sequence) -> str:
        """Text of a sample whose detokenization was deferred (no stop strings): one decode of the
        text tokens, with a few prompt tokens as context, equal to the incremental result."""
        if self.tokenizer is None or seq.params.stop or seq.text_pieces or not seq.num_text_tokens:
            return seq.text
        ctx = seq.token_ids[max(0, seq.num_prompt_tokens - 5) : seq.num_prompt_tokens]
        ids = seq.token_ids[seq.num_prompt_tokens : seq.num_prompt_tokens + seq.num_text_tokens]
        skip = seq.params.skip_special_tokens
        head = self.tokenizer.decode(ctx, skip_special_tokens=skip)
        full = self.tokenizer.decode(ctx + ids, skip_special_tokens=skip)
        seq.text_pieces = [
            full[len(head) :]
            if full.startswith(head)
            else self.tokenizer.decode(ids, skip_special_tokens=skip)
        ]
        return seq.text

    def request_output(self, req: Request) -> RequestOutput:
        m = req.metrics
        if m.finished_time is None and req.finished:
            m.finished_time = time.perf_counter()
            n_out = max((s.num_output_tokens for s in req.seqs), default=0)
            if m.first_token_time is not None and n_out > 1:
                m.time_per_output_token = (m.finished_time - m.arrival_time - m.first_token_time) / (
                    n_out - 1
                )
        outs = [
            CompletionOutput(
                index=s.sample_index,
                text=self._final_text(s),
                token_ids=list(s.output_token_ids),
                cumulative_logprob=s.cumulative_logprob if s.logprobs is not None else None,
                logprobs=s.logprobs,
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
            )
            for s in sorted(req.seqs, key=lambda s: s.sample_index)
        ]
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=list(req.prompt_token_ids),
            prompt_logprobs=req.prompt_logprobs,
            outputs=outs,
            finished=req.finished,
            num_cached_tokens=req.num_cached_tokens,
            metrics=m,
            error=req.error,
        )
