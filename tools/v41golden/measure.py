"""Measurements behind docs/v41_reference.md (printed by ``tools/v41_goldens.py --measure``, not committed).

- :func:`sensitivity`: how far a relative perturbation ``eps`` of every float32 parameter moves the prompt
  logprobs, per numerics mode (median and max absolute change, share of positions within 1e-3);
- :func:`decode_vs_prefill`: the logprobs of a prompt fed one token a forward against one prefill, with and
  without the decode fix (max and median over positions, the first position off by more than 1e-3);
- :func:`golden_floor`: the reference against itself perturbed by ``eps``, on the config's golden prompts and
  pooled as the engine's aggregate test pools them (mean |logprob diff| over every prompt position, greedy
  tokens equal from the start until the unperturbed reference's first near-tie), for several seeds: the
  noise floor of a comparison with an independent implementation in that mode.
"""

from __future__ import annotations

import torch

from . import patches, runs
from .config_goldens import MODES, Prepared, fresh_model

#: greedy tokens count until the reference's top-2 gap falls below this (tests/models/deepseek_v41/goldens.py)
NEAR_TIE = 1e-4


def _prompt_logprobs(ref, p: Prepared, ids: list[int], mode: str, model=None) -> torch.Tensor:
    model = model if model is not None else fresh_model(ref, p)
    with patches.numerics(ref, mode):
        _, logits, _ = runs.forward_once(model, ref, ids, 0)
    return logits.log_softmax(-1)[:-1].gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def _perturbed(ref, p: Prepared, eps: float, seed: int):
    model, g = fresh_model(ref, p), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dtype == torch.float32:
                param.mul_(1 + eps * torch.randn(param.shape, generator=g))
    return model


def _stats(d: torch.Tensor) -> dict:
    return {
        "mean": d.mean().item(),
        "median": d.median().item(),
        "max": d.max().item(),
        "within_1e-3": (d <= 1e-3).float().mean().item(),
    }


def sensitivity(ref, p: Prepared, ids: list[int], eps: float = 1e-6, seed: int = 1) -> dict:
    out = {}
    for mode in MODES:
        base = _prompt_logprobs(ref, p, ids, mode)
        moved = _prompt_logprobs(ref, p, ids, mode, _perturbed(ref, p, eps, seed))
        out[mode] = _stats((moved - base).abs())
    return out


def _stepwise(ref, p: Prepared, ids: list[int], mode: str, fix: bool) -> torch.Tensor:
    model, rows = fresh_model(ref, p), []
    with patches.numerics(ref, mode, fix):
        for pos, token in enumerate(ids):
            rows.append(runs.forward_once(model, ref, [token], pos)[1][-1].log_softmax(-1))
    return torch.stack(rows)


def decode_vs_prefill(ref, p: Prepared, ids: list[int], mode: str) -> dict:
    model = fresh_model(ref, p)
    with patches.numerics(ref, mode):
        prefill = runs.forward_once(model, ref, ids, 0)[1].log_softmax(-1)
    out = {}
    for fix in (True, False):
        d = (_stepwise(ref, p, ids, mode, fix) - prefill).abs().amax(-1)
        first = (d > 1e-3).nonzero()
        out[f"fix={fix}"] = {
            "max": d.max().item(),
            "median": d.median().item(),
            "first_over_1e-3": int(first[0]) if len(first) else None,
        }
    return out


def _golden_run(ref, p: Prepared, ids: list[int], mode: str, model=None) -> dict[str, torch.Tensor]:
    model = model if model is not None else fresh_model(ref, p)
    with patches.numerics(ref, mode):
        return runs.prompt_and_greedy(model, ref, ids, p.spec.greedy_tokens)


def _greedy_equal(base: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> tuple[int, int]:
    """``(equal, required)``: greedy tokens equal from the start, counted until ``base``'s first near-tie."""
    gaps, ref_ids, ids = base["greedy_top2_gap"], base["greedy_ids"].tolist(), got["greedy_ids"].tolist()
    required = next((k for k in range(len(ref_ids)) if float(gaps[k]) < NEAR_TIE), len(ref_ids))
    equal = next((k for k in range(len(ref_ids)) if ids[k] != ref_ids[k]), len(ref_ids))
    return min(equal, required), required


def golden_floor(
    ref, p: Prepared, mode: str, max_len: int, eps: float = 1e-6, seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
) -> dict:
    """Per seed: the pooled |logprob diff| statistics and greedy agreement of the reference in ``mode`` with
    every float32 parameter perturbed by ``eps`` against itself, on the golden prompts of up to ``max_len``
    tokens."""
    chosen = [ids for ids in p.prompts if len(ids) <= max_len]
    base = [_golden_run(ref, p, ids, mode) for ids in chosen]
    out = {}
    for seed in seeds:
        diffs, equal, required = [], 0, 0
        for ids, b in zip(chosen, base):
            got = _golden_run(ref, p, ids, mode, _perturbed(ref, p, eps, seed))
            diffs.append((got["logprob"] - b["logprob"]).abs())
            e, r = _greedy_equal(b, got)
            equal, required = equal + e, required + r
        out[f"seed={seed}"] = {**_stats(torch.cat(diffs)), "greedy_equal": [equal, required]}
    return out
