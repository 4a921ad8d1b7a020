"""A small CausalLM with the state kinds of DeepSeek-V4, for fast engine tests.

State per request:
- ``toy.win`` (window group): a per-token vector ``s_t``; the last ``WINDOW`` tokens are read.
- ``toy.cmp4`` / ``toy.cmp8`` (compressed group): one entry per 4 / 8 tokens, built from the ``s`` of
  the tokens of its compression window (read back from the window pool, so chunk boundaries inside a
  window are exercised like V4's compressor partial state).

The output of token ``t`` depends on its window and on every closed compressed entry, so any wrong,
stale or released block changes the logits. Reading a block the engine released (table entry ``-1``)
raises. Every reduction has a fixed length per row, so results do not depend on the batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch

WINDOW = 8
RATIOS = (4, 8)


class ToyHybridLM(CausalLM):
    def __init__(self, vocab_size: int = 96, dim: int = 16, max_pos: int = 1024, seed: int = 0, eos: int = 1):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.dim, self.max_position_embeddings = vocab_size, dim, max_pos
        self.eos_token_ids = [eos]
        self.embed = torch.randn(vocab_size, dim, generator=g)
        self.pos = 0.3 * torch.randn(max_pos, dim, generator=g)
        self.win_w = 0.5 * torch.randn(WINDOW, dim, generator=g)
        self.cmp_m = {r: torch.randn(dim, dim, generator=g) / dim**0.5 for r in RATIOS}
        self.cmp_decay = 0.8
        self.forward_calls = 0

    @classmethod
    def from_checkpoint(cls, path: Path, backends=None, dtype=torch.float32, options=None) -> ToyHybridLM:
        cfg = json.loads((Path(path) / "config.json").read_text())
        return cls(
            cfg["vocab_size"], cfg["dim"], cfg["max_position_embeddings"], cfg["seed"], cfg["eos_token_id"]
        )

    def cache_specs(self) -> list[CacheSpec]:
        specs = [CacheSpec("toy.win", "window", 1, (self.dim,), torch.float32, window=WINDOW)]
        specs += [CacheSpec(f"toy.cmp{r}", "compressed", r, (self.dim,), torch.float32) for r in RATIOS]
        return specs

    @staticmethod
    def _slots(
        batch: ForwardBatch, group: str, req: torch.Tensor, entry: torch.Tensor, r: int
    ) -> torch.Tensor:
        per_block = batch.block_size // r
        table = batch.block_tables[group]
        blk = table[req, torch.div(entry, per_block, rounding_mode="floor")]
        if bool((blk < 0).any()):
            raise AssertionError(f"toy model read a released or missing {group} block")
        return blk * per_block + entry % per_block

    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        self.forward_calls += 1
        req, pos = batch.request_index(), batch.positions
        win = kv["toy.win"].view(-1, self.dim)
        s = torch.tanh(self.embed[batch.input_ids] + self.pos[pos])
        win[self._slots(batch, "window", req, pos, 1)] = s
        for r in RATIOS:
            self._compress(batch, kv, req, pos, r)
        # window term: s of the previous WINDOW tokens, weighted by distance (fixed length per row)
        d = torch.arange(1, WINDOW + 1)
        wpos = pos[:, None] - d[None, :]
        valid = wpos >= 0
        wslots = self._slots(batch, "window", req[:, None].expand_as(wpos)[valid], wpos[valid], 1)
        wvals = torch.zeros(len(pos), WINDOW, self.dim)
        wvals[valid] = win[wslots]
        h = s + (wvals * self.win_w[None]).sum(1)
        for r in RATIOS:
            h = h + self._cmp_term(batch, kv, req, pos, r)
        return torch.tanh(h)

    def _compress(self, batch, kv, req, pos, r) -> None:
        """Tokens closing a compression window write entry ``pos // r`` from the window pool."""
        close = (pos + 1) % r == 0
        if not bool(close.any()):
            return
        creq, cpos = req[close], pos[close]
        src = cpos[:, None] - torch.arange(r - 1, -1, -1)[None, :]
        win = kv["toy.win"].view(-1, self.dim)
        vals = win[self._slots(batch, "window", creq[:, None].expand_as(src), src, 1)]  # [E, r, D]
        mean = vals.sum(1) / r
        entry = torch.tanh((mean[:, :, None] * self.cmp_m[r][None]).sum(1))
        pool = kv[f"toy.cmp{r}"].view(-1, self.dim)
        pool[self._slots(batch, "compressed", creq, torch.div(cpos, r, rounding_mode="floor"), r)] = entry

    def _cmp_term(self, batch, kv, req, pos, r) -> torch.Tensor:
        kmax = self.max_position_embeddings // r
        n_closed = torch.div(pos + 1, r, rounding_mode="floor")  # entries closed at or before pos
        e = torch.arange(kmax)[None, :].expand(len(pos), kmax)
        valid = e < n_closed[:, None]
        vals = torch.zeros(len(pos), kmax, self.dim)
        if bool(valid.any()):
            pool = kv[f"toy.cmp{r}"].view(-1, self.dim)
            vals[valid] = pool[
                self._slots(batch, "compressed", req[:, None].expand_as(e)[valid], e[valid], r)
            ]
        weight = torch.where(valid, self.cmp_decay ** (n_closed[:, None] - 1 - e).clamp(min=0).float(), 0.0)
        return (vals * weight[:, :, None]).sum(1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return 1.5 * (hidden[:, None, :] * self.embed[None]).sum(-1)


def write_toy_checkpoint(
    path: Path, vocab_size: int = 96, dim: int = 16, max_pos: int = 1024, seed: int = 0
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["ToyHybridLM"],
        "vocab_size": vocab_size,
        "dim": dim,
        "max_position_embeddings": max_pos,
        "seed": seed,
        "eos_token_id": 1,
    }
    (path / "config.json").write_text(json.dumps(cfg))
    return path


class ToyTokenizer:
    """Token ``i`` is the text ``PIECES[i]``: multi-character pieces, so stop strings span tokens."""

    def __init__(self, vocab_size: int = 96):
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.pieces = ["<s>", "</s>"] + [letters[i % 26] * (1 + (i // 26)) for i in range(vocab_size - 2)]
        self.special = {0, 1}
        self.eos_token_id = 1

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i in self.special))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [0] if add_special_tokens else []
        return ids + [2 + (ord(c) - 97) for c in text if "a" <= c <= "z"]
