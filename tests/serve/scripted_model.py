"""A model that writes given completions: after a registered prompt it writes its completion token by
token, then EOS; after any other context it writes EOS.

It keeps every token it is shown in its own KV pool (one id per position), so it reads whole contexts
through the engine's block tables like a real model reads its KV cache: chunked prefill, batching,
preemption and prefix caching all go through the engine's real paths. The serving tests use it to make
the model produce exactly the text of an assistant turn rendered by the chat encoding (reasoning, DSML
tool calls) with the real DeepSeek-V4 tokenizer.
"""

from __future__ import annotations

import time

import torch

from deepinfer_core.kv.spec import CacheSpec
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch


class ScriptedLM(CausalLM):
    def __init__(self, vocab_size: int, eos_token_id: int, max_pos: int = 4096):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_pos
        self.eos_token_ids = [eos_token_id]
        self.scripts: dict[tuple[int, ...], list[int]] = {}
        #: seconds each forward sleeps (a test that must observe a request mid-generation sets it, so that
        #: a loaded machine cannot let the request finish before the test looks)
        self.step_delay_s = 0.0

    @classmethod
    def from_checkpoint(cls, path, backends, dtype, options=None):  # pragma: no cover - built directly
        raise NotImplementedError

    def add(self, prompt_ids: list[int], completion_ids: list[int]) -> None:
        """After ``prompt_ids`` write ``completion_ids`` (end it with EOS to stop there)."""
        self.scripts[tuple(prompt_ids)] = list(completion_ids)

    def cache_specs(self) -> list[CacheSpec]:
        return [CacheSpec("script.tokens", "compressed", 1, (1,), torch.int64)]

    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        pool = kv["script.tokens"].view(-1)
        table, bs = batch.block_tables["compressed"], batch.block_size
        req, pos = batch.request_index(), batch.positions
        pool[table[req, pos // bs] * bs + pos % bs] = batch.input_ids
        out = torch.zeros(len(pos), 1)
        for row in batch.logits_indices.tolist():
            ctx = torch.arange(int(pos[row]) + 1)
            r = int(req[row])
            out[row, 0] = self._next(pool[table[r, ctx // bs] * bs + ctx % bs].tolist())
        return out

    def _next(self, ctx: list[int]) -> int:
        for prompt, completion in self.scripts.items():
            k = len(ctx) - len(prompt)
            if (
                0 <= k < len(completion)
                and tuple(ctx[: len(prompt)]) == prompt
                and ctx[len(prompt) :] == completion[:k]
            ):
                return completion[k]
        return self.eos_token_ids[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return 30.0 * torch.nn.functional.one_hot(hidden[:, 0].to(torch.int64), self.vocab_size).to(
            torch.float32
        )


class PoisonLM(CausalLM):
    """Wraps a model and raises inside the engine's step whenever ``poison`` is among the step's tokens."""

    def __init__(self, inner: CausalLM, poison: int):
        self.inner, self.poison = inner, poison
        self.vocab_size = inner.vocab_size
        self.max_position_embeddings = inner.max_position_embeddings
        self.eos_token_ids = inner.eos_token_ids

    @classmethod
    def from_checkpoint(cls, path, backends, dtype, options=None):  # pragma: no cover - built directly
        raise NotImplementedError

    def cache_specs(self) -> list[CacheSpec]:
        return self.inner.cache_specs()

    def forward(self, batch: ForwardBatch, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        if bool((batch.input_ids == self.poison).any()):
            raise RuntimeError(f"poisoned token {self.poison} in the batch")
        return self.inner.forward(batch, kv)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.inner.compute_logits(hidden)
