"""A random-weight model in miniature, for grammar-level tests.

Each request draws fresh N(0, 1) logits over the real 129,280-token V4 vocabulary from its own
generator every step; the manager's bitmask is applied with the reference ``apply_bitmask`` and a
token is drawn at temperature 1 (inverse CDF, one uniform from the same generator). With no learned
structure in the logits, the grammar alone decides the shape of the output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.structured import StructuredOutputManager

V = 129280
EOS = 1
REFERENCE_OPS = ReferenceSamplingOps()


@dataclass
class Generated:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop": the grammar terminated (or an unconstrained EOS); "length"

    @property
    def body(self) -> list[int]:
        """The tokens without the final stop token."""
        return self.tokens[:-1] if self.finish_reason == "stop" else self.tokens


def sample_rows(logits: torch.Tensor, generators: list[torch.Generator]) -> list[int]:
    """One temperature-1 draw per row; a token whose logit is -inf has probability 0 and is never drawn."""
    cdf = torch.softmax(logits.double(), dim=-1).cumsum(-1)
    u = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in generators])
    u = u[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp(max=logits.shape[-1] - 1).flatten().tolist()


def generate(
    manager: StructuredOutputManager,
    requests: Mapping[str, Any],
    seeds: Mapping[str, int],
    max_tokens: int = 256,
    prompts: Mapping[str, list[int]] | None = None,
    forced: Mapping[str, list[int]] | None = None,
) -> dict[str, Generated]:
    """Run ``requests`` (id -> structured_outputs params, or None for unconstrained) as one batch.

    ``forced[rid]`` are tokens the model emits first instead of sampling (e.g. a reasoning block); each
    must be allowed by the request's mask at its step."""
    prompts, forced = prompts or {}, {r: list(t) for r, t in (forced or {}).items()}
    for rid, params in requests.items():
        manager.validate_and_compile(rid, params, prompts.get(rid))
    gens = {rid: torch.Generator().manual_seed(seeds[rid]) for rid in requests}
    out = {rid: Generated() for rid in requests}
    live = list(requests)
    for _ in range(max_tokens):
        if not live:
            break
        logits = torch.stack([torch.randn(V, generator=gens[r]) for r in live])
        mask = manager.fill_bitmask(live)
        if mask is not None:
            logits = REFERENCE_OPS.apply_bitmask(logits, mask)
        tokens = sample_rows(logits, [gens[r] for r in live])
        for i, rid in enumerate(live):
            if forced.get(rid):
                tokens[i] = forced[rid].pop(0)
                assert torch.isfinite(logits[i, tokens[i]]), f"{rid}: forced token {tokens[i]} is masked"
        still = []
        for rid, tok in zip(live, tokens):
            out[rid].tokens.append(tok)
            terminated = manager.accept(rid, [tok])
            if terminated or (not manager.is_constrained(rid) and tok == EOS):
                out[rid].finish_reason = "stop"
                manager.free(rid)
            else:
                still.append(rid)
        live = still
    for rid in live:
        out[rid].finish_reason = "length"
        manager.free(rid)
    return out
