"""Engram table sizes: the bucket primes of every (layer, n-gram size, head) and each layer's row count.

Rule (read from the reference and checked against its ``EngramLayout`` when goldens are written): for each
Engram layer in order, for each n-gram size 2..max_ngram_size, for each head, the bucket modulus is the
smallest prime greater than ``engram_vocab_size - 1`` that no earlier (layer, n-gram, head) took. The search
restarts from ``engram_vocab_size - 1`` for every n-gram size, so the primes only ever grow and are unique
across the whole model. A layer's table has ``sum(its primes)`` rows; head ``j`` of n-gram size ``n`` owns the
row range starting at the sum of the primes before it (n-gram-major, head-minor).
"""

from __future__ import annotations


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def bucket_primes(n_layers: int, max_ngram_size: int, n_heads: int, vocab_size: int) -> list[list[list[int]]]:
    """``[engram layer][n-gram size - 2][head]`` bucket moduli."""
    seen: set[int] = set()
    out = []
    for _ in range(n_layers):
        per_ngram = []
        for _ in range(max_ngram_size - 1):
            current, sizes = vocab_size - 1, []
            for _ in range(n_heads):
                current += 1
                while not _is_prime(current) or current in seen:
                    current += 1
                seen.add(current)
                sizes.append(current)
            per_ngram.append(sizes)
        out.append(per_ngram)
    return out


def table_rows(engram: dict) -> tuple[int, ...]:
    """Rows of each Engram layer's table for a spec's ``engram`` settings (empty when there is none)."""
    if not engram:
        return ()
    primes = bucket_primes(
        len(engram["layer_ids"]), engram["max_ngram_size"], engram["n_heads"], engram["vocab_size"]
    )
    return tuple(sum(p for per_ngram in layer for p in per_ngram) for layer in primes)
