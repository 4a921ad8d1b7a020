"""A small CausalLM shaped like DeepSeek-V4.1 (CSA2, encoder then decoder), for the KV-spec and layer-range
seams. ``D`` channels, five layers:

- 0 (SWA): ``l0.win``, its input per token (group ``swa``, window 8).
- 1 (ratio-2 source): ``l1.state``, a projection per token (group ``partial``, window 1), pooled in pairs
  into ``l1.ckv``, one packed FP4 entry (e2m1, an e4m3 scale per 16) per 2 tokens, read by layers 1 and 4.
- 2 (ratio-1 source): ``l2.gkv``, one packed FP8 entry (e4m3, a ue8m0 scale per 32) per token, read by
  layers 2 and 3 (the "global KV").
- 3, 4 (decoder): each its own ``l{i}.win`` (group ``dec``, window 3) read over 4 positions, plus the
  published entries.

Groups carry no special names: ``swa`` and ``partial`` slide, ``global`` is kept, ``dec`` slides and is
written only by the decoder. A row of layer 4 depends on the layer-2 outputs of the 6 rows before it, so
the decoder needs only the last ``REPLAY`` rows of a chunk (:meth:`bounded_replay`) and still gives every
row's result exactly. Every reduction has a fixed length per row, so results do not depend on the batch,
and reading a block the engine released raises.
"""

from __future__ import annotations

import torch

from deepinfer_core.config import load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.kv.packed import PackedFormat
from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch

from .conftest import toy_backends

D = 32
REPLAY = 12
FP4 = PackedFormat("e2m1", "e4m3", 16, (D,))
FP8 = PackedFormat("e4m3", "ue8m0", 32, (D,))
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def pack_fp4(x: torch.Tensor) -> torch.Tensor:
    """``[N, D]`` -> ``[N, FP4.entry_bytes]``: e2m1 codes (nearest, ties up) of ``x / scale``, e4m3 scales."""
    g = x.view(len(x), D // FP4.block, FP4.block)
    scale = (g.abs().amax(-1) / 6).clamp_min(2.0**-6).to(torch.float8_e4m3fn)
    y = (g / scale.float()[..., None]).clamp(-6, 6).flatten(1)
    code = torch.bucketize(y.abs(), (E2M1[1:] + E2M1[:-1]) / 2) | ((y < 0).long() << 3)
    out = torch.empty(len(x), FP4.entry_bytes, dtype=torch.uint8)
    codes, scales = FP4.split(out)
    codes.copy_(code[:, 0::2] | code[:, 1::2] << 4)
    scales.copy_(scale)
    return out


def unpack_fp4(entries: torch.Tensor) -> torch.Tensor:
    codes, scales = FP4.split(entries)
    nib = torch.stack([codes & 15, codes >> 4], -1).flatten(-2).long()
    vals = E2M1[nib & 7] * (1 - 2 * (nib >> 3)).float()
    return vals * scales.float().repeat_interleave(FP4.block, -1)


def pack_fp8(x: torch.Tensor) -> torch.Tensor:
    """``[N, D]`` -> ``[N, FP8.entry_bytes]``: e4m3 codes of ``x / scale``, power-of-two (ue8m0) scales."""
    g = x.view(len(x), D // FP8.block, FP8.block)
    scale = torch.exp2(torch.ceil(torch.log2(g.abs().amax(-1).clamp_min(2.0**-60) / 448)))
    out = torch.empty(len(x), FP8.entry_bytes, dtype=torch.uint8)
    codes, scales = FP8.split(out)
    codes.copy_((g / scale[..., None]).flatten(1).to(torch.float8_e4m3fn).view(torch.uint8))
    scales.copy_(scale.to(torch.float8_e8m0fnu))
    return out


def unpack_fp8(entries: torch.Tensor) -> torch.Tensor:
    codes, scales = FP8.split(entries)
    return codes.view(torch.float8_e4m3fn).float() * scales.float().repeat_interleave(FP8.block, -1)


def mix(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``x @ m`` as a fixed-length reduction per row (no GEMM whose blocking depends on the row count)."""
    return (x[:, :, None] * m[None]).sum(1)


class ToyCSA2LM(CausalLM):
    num_layers = 5

    def __init__(self, vocab_size: int = 96, max_pos: int = 512, seed: int = 0, replay: int = REPLAY):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.max_position_embeddings, self.eos_token_ids = vocab_size, max_pos, [1]
        self.embed = torch.randn(vocab_size, D, generator=g)
        self.pos = 0.3 * torch.randn(max_pos, D, generator=g)
        self.w = {i: 0.5 * torch.randn(n, D, generator=g) for i, n in ((0, 8), (3, 4), (4, 4))}
        self.m = {i: torch.randn(D, D, generator=g) / D**0.5 for i in range(5)}
        self.replay = replay
        self.decoder_rows = 0  # rows layers 3 and 4 ran on, over all steps

    @classmethod
    def from_checkpoint(cls, path, backends=None, dtype=torch.float32, options=None) -> ToyCSA2LM:
        raise NotImplementedError("built directly by the tests")

    def cache_specs(self) -> list[CacheSpec]:
        f = torch.float32
        return [
            CacheSpec("l0.win", "swa", 1, (D,), f, window=8, writer=0, readers=(0,)),
            CacheSpec("l1.state", "partial", 1, (D,), f, window=1, writer=1, readers=(1,)),
            CacheSpec.packed_entries("l1.ckv", "global", 2, FP4, writer=1, readers=(1, 4)),
            CacheSpec.packed_entries("l2.gkv", "global", 1, FP8, writer=2, readers=(2, 3)),
            CacheSpec("l3.win", "dec", 1, (D,), f, window=3, writer=3, readers=(3,)),
            CacheSpec("l4.win", "dec", 1, (D,), f, window=3, writer=4, readers=(4,)),
        ]

    def bounded_replay(self) -> tuple[int, int]:
        return 3, self.replay

    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self._encoder(batch, kv)
        if batch.tail is None:
            return self._decoder(batch, kv, x)
        rows = batch.tail.rows
        return x.index_copy(0, rows, self._decoder(batch.tail.batch, kv, x[rows]))

    def _encoder(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        req, pos = batch.request_index(), batch.positions
        x = torch.tanh(self.embed[batch.input_ids] + self.pos[pos])
        x = torch.tanh(x + self._window(batch, kv, "l0.win", "swa", x, req, pos, first=1, w=self.w[0]))
        state = torch.tanh(mix(x, self.m[0]))
        self._pool(kv, "l1.state")[self._slots(batch, "partial", req, pos, 1)] = state
        self._compress(batch, kv, req, pos)
        x = torch.tanh(x + self._entries(batch, kv, "l1.ckv", 2, unpack_fp4, req, pos))
        gkv = pack_fp8(torch.tanh(mix(x, self.m[2])))
        kv["l2.gkv"].view(-1, FP8.entry_bytes)[self._slots(batch, "global", req, pos, 1)] = gkv
        return torch.tanh(x + self._entries(batch, kv, "l2.gkv", 1, unpack_fp8, req, pos))

    def _decoder(self, batch: ForwardBatch, kv: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        req, pos = batch.request_index(), batch.positions
        self.decoder_rows += len(pos)
        published = (("l2.gkv", 1, unpack_fp8), ("l1.ckv", 2, unpack_fp4))
        for layer, (name, ratio, unpack) in zip((3, 4), published):
            k = torch.tanh(mix(x, self.m[layer]))
            win = self._window(batch, kv, f"l{layer}.win", "dec", k, req, pos, first=0, w=self.w[layer])
            x = torch.tanh(x + win + 0.5 * self._entries(batch, kv, name, ratio, unpack, req, pos))
        return x

    def _window(self, batch, kv, name, group, value, req, pos, first: int, w: torch.Tensor) -> torch.Tensor:
        """Write ``value`` at each row's position of ``name``, then sum the pool over positions
        ``pos - first - i`` weighted by ``w[i]``."""
        pool = self._pool(kv, name)
        pool[self._slots(batch, group, req, pos, 1)] = value
        wpos = pos[:, None] - first - torch.arange(len(w))[None, :]
        valid = wpos >= 0
        vals = torch.zeros(len(pos), len(w), D)
        vals[valid] = pool[self._slots(batch, group, req[:, None].expand_as(wpos)[valid], wpos[valid], 1)]
        return (vals * w[None]).sum(1)

    def _compress(self, batch, kv, req, pos) -> None:
        """Rows closing a pair write entry ``pos // 2`` of ``l1.ckv`` from the pair's ``l1.state``."""
        close = (pos + 1) % 2 == 0
        if not bool(close.any()):
            return
        creq, cpos = req[close], pos[close]
        src = torch.stack([cpos - 1, cpos], 1)
        pair = self._pool(kv, "l1.state")[self._slots(batch, "partial", creq[:, None].expand_as(src), src, 1)]
        entry = pack_fp4(torch.tanh(mix(pair.sum(1) / 2, self.m[1])))
        kv["l1.ckv"].view(-1, FP4.entry_bytes)[self._slots(batch, "global", creq, cpos // 2, 2)] = entry

    def _entries(self, batch, kv, name, ratio, unpack, req, pos) -> torch.Tensor:
        """Decayed sum of every entry of ``name`` closed at or before each row (fixed length per row).
        Each request's entries are unpacked once, up to those its step closes."""
        kmax = self.max_position_embeddings // ratio
        e = torch.arange(kmax)
        in_step = e[None, :] < (batch.context_lens // ratio)[:, None]  # [B, kmax]
        vals = torch.zeros(batch.num_requests, kmax, D)
        if bool(in_step.any()):
            owner = torch.arange(batch.num_requests)[:, None].expand_as(in_step)[in_step]
            pool = kv[name].view(-1, kv[name].shape[-1])
            vals[in_step] = unpack(
                pool[self._slots(batch, "global", owner, e[None, :].expand_as(in_step)[in_step], ratio)]
            )
        closed = (pos + 1) // ratio
        weight = torch.where(
            e[None, :] < closed[:, None], 0.8 ** (closed[:, None] - 1 - e).clamp(min=0).float(), 0.0
        )
        return (vals[req] * weight[:, :, None]).sum(1)

    def _pool(self, kv: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return kv[name].view(-1, D)

    @staticmethod
    def _slots(batch: ForwardBatch, group: str, req, entry, ratio: int) -> torch.Tensor:
        per_block = batch.block_size // ratio
        blk = batch.block_tables[group][req, torch.div(entry, per_block, rounding_mode="floor")]
        if bool((blk < 0).any()):
            raise AssertionError(f"toy model read a released or missing {group} block")
        return blk * per_block + entry % per_block

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return 1.5 * (hidden[:, None, :] * self.embed[None]).sum(-1)


def make_csa2_llm(replay: int = REPLAY, **cfg) -> LLM:
    cfg.setdefault("kv_cache_memory_bytes", 8 << 20)
    cfg.setdefault("max_model_len", 512)
    return LLM.from_engine(
        LLMEngine(load_config(environ={}, **cfg), ToyCSA2LM(replay=replay), toy_backends())
    )
