"""Held-out loss and bits per byte of a checkpoint, computed through the engine (teacher-forced
``prompt_logprobs``), so the figure covers the model code, the loader and the weight format together."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HeldoutScore:
    tokens: int
    bytes: int
    nats: float

    @property
    def loss(self) -> float:
        """Mean negative log-likelihood per predicted token (nats)."""
        return self.nats / self.tokens

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes


def heldout_score(llm, texts: list[str], window: int = 256) -> HeldoutScore:
    """Split each text into ``window``-token pieces (BOS first) and score every token after the first."""
    from deepinfer_core import SamplingParams

    tok = llm.get_tokenizer()
    prompts = []
    for text in texts:
        ids = tok(text, add_special_tokens=False).input_ids
        for i in range(0, len(ids), window - 1):
            piece = [tok.bos_token_id, *ids[i : i + window - 1]]
            if len(piece) > 2:
                prompts.append(piece)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    nats, n_tok, n_bytes = 0.0, 0, 0
    for p, out in zip(prompts, outs):
        for tid, lp in zip(p[1:], out.prompt_logprobs[1:]):
            nats -= lp[tid].logprob
        n_tok += len(p) - 1
        n_bytes += len(tok.decode(p[1:], skip_special_tokens=True).encode("utf-8"))
    return HeldoutScore(n_tok, n_bytes, nats)
