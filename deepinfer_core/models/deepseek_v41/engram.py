"""V4.1 Engram: n-gram hash ids over tokenizer-normalised token ids (``docs/v41_reference.md``, 3.2).

- **Compressed token map.** Token ``i`` is decoded alone by the raw tokenizer. Text with U+FFFD (a partial
  UTF-8 byte) is keyed by its raw token string; other text by NFKC, NFD, accents stripped, lowercase, every
  run of ``[ \\t\\r\\n]`` replaced by one space, stripped, except that a text that is exactly one space stays
  one space (an empty result keys by the original text). Ids are handed out by first appearance.
- **Bucket primes.** Per Engram layer, n-gram size ``2..max`` and head: the smallest prime above
  ``engram_vocab_size - 1`` not yet taken (the search restarts for every n-gram size). Column ``j`` of a layer
  (n-gram-major, head-minor) owns the rows from the sum of the primes before it.
- **Multipliers** of layer ``l``: ``default_rng(10007 * l).integers(0, bound, max_ngram_size) * 2 + 1`` with
  ``bound = max(1, (2**63 - 1) // compressed_vocab // 2)``.
- **Hash** at position ``p``: ``t_s`` = compressed id of the token at ``p - s`` (the pad id before the
  sequence start), ``rolling = t_0 * m_0``; for ``n = 2..max``: ``rolling ^= t_{n-1} * m_{n-1}`` and
  ``hash = rolling % prime + offset`` (int64).

The look-back (``max_ngram_size - 1`` tokens before a chunk) is the model's: it keeps the compressed ids in
a windowed cache spec, so chunk boundaries and decode steps read the same history a single pass would.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deepinfer_core.models.deepseek_v41.config import EngramConfig, ModelConfigError
from deepinfer_core.ops.dense import engram_hash_rows

SEED_STRIDE = 10007


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for 64-bit ``n``."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    if n in small:
        return True
    if any(n % p == 0 for p in small):
        return False
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def bucket_primes(e: EngramConfig) -> list[list[list[int]]]:
    """``[engram layer][n-gram size - 2][head]`` moduli, unique across the model."""
    taken: set[int] = set()
    out = []
    for _ in e.layer_ids:
        per_layer = []
        for _ in range(e.max_ngram_size - 1):
            current, heads = e.vocab_size - 1, []
            for _ in range(e.n_heads):
                current += 1
                while not is_prime(current) or current in taken:
                    current += 1
                taken.add(current)
                heads.append(current)
            per_layer.append(heads)
        out.append(per_layer)
    return out


def multipliers(e: EngramConfig) -> torch.Tensor:
    """``[n engram layers, max_ngram_size]`` odd int64 multipliers."""
    bound = max(1, (np.iinfo(np.int64).max // e.compressed_vocab_size) // 2)
    rows = [
        np.random.default_rng(SEED_STRIDE * layer).integers(
            0, bound, size=(e.max_ngram_size,), dtype=np.int64
        )
        for layer in e.layer_ids
    ]
    return torch.from_numpy(np.stack(rows) * 2 + 1)


def compressed_token_map(tokenizer_file: Path) -> tuple[torch.Tensor, int]:
    """``(map [vocab] int64, number of compressed ids)`` from a ``tokenizer.json``."""
    from tokenizers import Regex, Tokenizer, normalizers

    tok = Tokenizer.from_file(str(tokenizer_file))
    one_space = "\ue000"  # private use: survives Strip, so a lone space keeps its own key
    norm = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), one_space),
            normalizers.Strip(),
            normalizers.Replace(one_space, " "),
        ]
    )
    ids: dict[str, int] = {}
    table = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = norm.normalize_str(text) or text
        table.append(ids.setdefault(key, len(ids)))
    return torch.tensor(table, dtype=torch.int64), len(ids)


@dataclass
class EngramHasher:
    """The hash of every (position, Engram layer, column); built once from the config and the tokenizer."""

    token_map: torch.Tensor  # [vocab] int64
    pad_id: int  # compressed id of ``engram_pad_id``
    primes: torch.Tensor  # [layers, max_ngram_size - 1, heads] int64
    offsets: torch.Tensor  # [layers, (max_ngram_size - 1) * heads] int64
    multipliers: torch.Tensor  # [layers, max_ngram_size] int64

    @classmethod
    def build(cls, e: EngramConfig, checkpoint: Path) -> EngramHasher:
        file = Path(checkpoint) / "tokenizer.json"
        if not file.is_file():
            raise ModelConfigError(f"{checkpoint}: Engram hashes need the checkpoint's tokenizer.json")
        token_map, n = compressed_token_map(file)
        if n != e.compressed_vocab_size:
            raise ModelConfigError(
                f"{file}: the tokenizer normalises to {n} compressed ids, but config.json says "
                f"engram_compressed_vocab_size={e.compressed_vocab_size} (every hash would differ)"
            )
        primes = bucket_primes(e)
        sizes = [[p for per_n in layer for p in per_n] for layer in primes]
        rows = [sum(s) for s in sizes]
        if tuple(rows) != tuple(e.num_embeddings):
            raise ModelConfigError(
                f"config.json: engram_num_embeddings={list(e.num_embeddings)}, but the bucket primes sum to {rows}"
            )
        offsets = torch.tensor([np.cumsum([0, *s[:-1]]).tolist() for s in sizes], dtype=torch.int64)
        return cls(token_map, int(token_map[e.pad_id]), torch.tensor(primes), offsets, multipliers(e))

    def to(self, device: torch.device) -> EngramHasher:
        return EngramHasher(
            self.token_map.to(device), self.pad_id, self.primes.to(device), self.offsets.to(device),
            self.multipliers.to(device),
        )  # fmt: skip

    def hash_ids(self, history: torch.Tensor) -> torch.Tensor:
        """``history [T, max_ngram_size]``: the compressed ids at ``p, p-1, ...`` (``-1`` before the start)
        -> ``[T, layers, (max_ngram_size - 1) * heads]`` int64 table rows."""
        return engram_hash_rows(history, self.pad_id, self.multipliers, self.primes, self.offsets)

    def rows(self, ids: torch.Tensor, slots: torch.Tensor, ops) -> torch.Tensor:
        """:meth:`hash_ids` of the ids ``ids[slots]`` of the look-back pool (``ops.dense.engram_hashes``: one
        launch on a platform that has it)."""
        return ops.dense.engram_hashes(ids, slots, self.pad_id, self.multipliers, self.primes, self.offsets)
