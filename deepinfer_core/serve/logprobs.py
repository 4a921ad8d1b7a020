"""The engine's per-position logprobs in OpenAI's two layouts.

The engine gives, per generated token, ``{token_id: Logprob(logprob, rank, decoded_token)}``: the top
``k`` tokens plus the sampled one (so up to ``k + 1`` entries, as OpenAI documents for completions).
Completions list them per position (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``);
chat lists ``{token, logprob, bytes, top_logprobs}`` per token with exactly the top ``k`` alternatives.
A token's string is its own decoding (a lone byte of a multi-byte character decodes to U+FFFD).
"""

from __future__ import annotations

import math

from deepinfer_core.engine.outputs import Logprob, PositionLogprobs
from deepinfer_core.serve.responses import CompletionLogprobs, TokenLogprob, TopLogprob

#: JSON has no -inf; a token the model gives no chance gets this instead
LOGPROB_FLOOR = -9999.0


def _value(lp: float) -> float:
    return lp if math.isfinite(lp) else LOGPROB_FLOOR


def _token(tid: int, lp: Logprob | None) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return f"token_id:{tid}"


class CompletionLogprobsBuilder:
    """Builds the ``logprobs`` of one completions choice, chunk by chunk (``text_offset`` runs on)."""

    def __init__(self, offset: int = 0):
        self.offset = offset

    def prompt(
        self, token_ids: list[int], positions: list[PositionLogprobs | None] | None
    ) -> CompletionLogprobs:
        """Echoed prompt tokens; the first has no logprob (nothing precedes it)."""
        out = CompletionLogprobs()
        for i, tid in enumerate(token_ids):
            pos = positions[i] if positions is not None and i < len(positions) else None
            self._append(out, tid, pos)
        return out

    def add(self, token_ids: list[int], positions: list[PositionLogprobs]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid, pos in zip(token_ids, positions, strict=True):
            self._append(out, tid, pos)
        return out

    def _append(self, out: CompletionLogprobs, tid: int, pos: PositionLogprobs | None) -> None:
        entry = pos.get(tid) if pos else None
        token = _token(tid, entry)
        out.tokens.append(token)
        out.token_logprobs.append(_value(entry.logprob) if entry is not None else None)
        out.top_logprobs.append({_token(t, lp): _value(lp.logprob) for t, lp in pos.items()} if pos else None)
        out.text_offset.append(self.offset)
        self.offset += len(token)


def merge(parts: list[CompletionLogprobs]) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for p in parts:
        out.tokens += p.tokens
        out.token_logprobs += p.token_logprobs
        out.top_logprobs += p.top_logprobs
        out.text_offset += p.text_offset
    return out


def chat_logprobs(token_ids: list[int], positions: list[PositionLogprobs], top_k: int) -> list[TokenLogprob]:
    out = []
    for tid, pos in zip(token_ids, positions, strict=True):
        entry = pos.get(tid)
        token = _token(tid, entry)
        top = sorted((lp.rank, t, lp) for t, lp in pos.items() if lp.rank <= top_k)
        out.append(
            TokenLogprob(
                token=token,
                logprob=_value(entry.logprob) if entry is not None else LOGPROB_FLOOR,
                bytes=list(token.encode("utf-8", "surrogatepass")),
                top_logprobs=[
                    TopLogprob(
                        token=_token(t, lp), logprob=_value(lp.logprob), bytes=list(_token(t, lp).encode())
                    )
                    for _, t, lp in top[:top_k]
                ],
            )
        )
    return out
