"""Reading the committed V4.1 goldens (``tests/data/v41``) and comparing the engine with them by the issue's
criterion (``docs/v41_reference.md``, 4 and 7)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

DATA = Path(__file__).resolve().parents[2] / "data" / "v41"
CONFIGS = ("flash_mini", "long_pool", "reindex_r2")
#: a disagreement that a reference top-k margin below this explains ends a request's comparison
MARGIN = 3e-4
#: greedy tokens are compared until the reference's top-2 gap falls below this
NEAR_TIE = 1e-4


def checkpoint(name: str) -> Path:
    return DATA / name / "checkpoint"


def prompts(name: str) -> tuple[dict[str, torch.Tensor], list[int]]:
    g = load_file(str(DATA / name / "prompts.safetensors"))
    return g, sorted({int(k.split(".")[1]) for k in g if k.startswith("prompt.")})


def inference_config(name: str) -> dict:
    return json.loads((checkpoint(name) / "inference" / "config.json").read_text())


@dataclass
class Agreement:
    diffs: torch.Tensor  # |engine - reference| of every compared prompt position
    stopped: int  # requests whose comparison stopped at a margin-explained disagreement
    greedy_equal: int  # greedy tokens equal before a near-tie or the end
    greedy_compared: int  # greedy tokens the rule asks to be equal

    @property
    def within_1e3(self) -> float:
        return float((self.diffs <= 1e-3).float().mean())

    @property
    def median(self) -> float:
        return float(self.diffs.median())


def prompt_diffs(ref: torch.Tensor, got: torch.Tensor, margins: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The diffs to count: every position, or those before the first disagreement (> 1e-3) that a running
    minimum top-k margin below :data:`MARGIN` explains."""
    d = (got - ref).abs()
    low = margins[: len(d)].amin(dim=1).cummin(dim=0).values < MARGIN
    bad = torch.nonzero((d > 1e-3) & low).flatten()
    return (d[: int(bad[0])], True) if bad.numel() else (d, False)


def greedy_prefix(
    ref_ids: list[int], got: list[int], gaps: torch.Tensor, margins: torch.Tensor, prompt_margin: float
) -> tuple[int, int, bool]:
    """``(equal, required, excused)``: greedy tokens equal from the start; how many the rule requires (those
    before the reference's first near-tie, top-2 gap below :data:`NEAR_TIE`); and whether a disagreement
    before that is explained by a running minimum top-k margin (prompt and decode) below :data:`MARGIN`."""
    required = next((k for k in range(len(ref_ids)) if float(gaps[k]) < NEAR_TIE), len(ref_ids))
    equal = next((k for k in range(len(ref_ids)) if k >= len(got) or got[k] != ref_ids[k]), len(ref_ids))
    excused = equal < required and min(prompt_margin, float(margins[: equal + 1].min())) < MARGIN
    return equal, required, excused
