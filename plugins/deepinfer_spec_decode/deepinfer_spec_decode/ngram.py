"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the latest earlier occurrence
of the context's suffix. Needs no draft weights; its drafts are one-hot (q = 1 on the draft)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepinfer_core.plugin_api import ConfigError, Proposer

if TYPE_CHECKING:
    from deepinfer_core.plugin_api import DraftSequence


def ngram_propose(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` draft tokens for the sequence ``tokens`` (prompt + output so far).

    Tries suffix lengths ``n = max_n .. min_n``; for the first ``n`` whose suffix ``tokens[-n:]``
    occurs earlier, returns the (at most ``k``) tokens that followed its most recent earlier occurrence.
    Returns ``[]`` when no suffix recurs.
    """
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= prompt_lookup_min ({min_n}) <= prompt_lookup_max ({max_n})")
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        # most recent earlier occurrence: scan start positions right to left, excluding the suffix itself
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
    return []


class NgramProposer(Proposer):
    """``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b}``."""

    def __init__(self, k: int, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ConfigError(
                f"speculative_config: need 1 <= prompt_lookup_min ({min_n}) <= prompt_lookup_max ({max_n})"
            )
        self.num_speculative_tokens, self.min_n, self.max_n = k, min_n, max_n

    def propose(self, seqs: list[DraftSequence], limits: list[int]) -> list[list[int]]:
        return [ngram_propose(s.token_ids, k, self.min_n, self.max_n) for s, k in zip(seqs, limits)]


def make_ngram(model: Any, spec: dict[str, Any], config: Any) -> NgramProposer:
    k = spec["num_speculative_tokens"]
    min_n = spec.get("prompt_lookup_min", 1)
    max_n = spec.get("prompt_lookup_max", max(min_n, 4))
    return NgramProposer(k, min_n, max_n)
