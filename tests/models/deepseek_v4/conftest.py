"""Shared tiny checkpoints (built once per session) for the DeepSeek-V4 model tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .tiny import CSA, HCA, SWA, Schedule, build_hf, reference_backends, save_deepseek, save_transformers

# Layer schedules: every attention kind, hc_mult 1/2/4, HCA ratios 16/24/32/128, hash layers 0..all.
SCHEDULES = {
    "swa_csa_hca_hc2": Schedule(
        "swa_csa_hca_hc2", (SWA, CSA, HCA, CSA), hc_mult=2, num_hash_layers=1, hca_rate=16
    ),
    "hc4_hca32_hash2": Schedule(
        "hc4_hca32_hash2",
        (CSA, HCA, SWA),
        hc_mult=4,
        num_hash_layers=2,
        hca_rate=32,
        sliding_window=16,
        index_topk=8,
    ),
    "hc1_all_hash": Schedule(
        "hc1_all_hash",
        (HCA, SWA, CSA),
        hc_mult=1,
        num_hash_layers=3,
        hca_rate=16,
        sliding_window=4,
        index_topk=2,
    ),
    "no_hash_topk_all": Schedule(
        "no_hash_topk_all",
        (CSA, CSA, HCA),
        hc_mult=2,
        num_hash_layers=0,
        hca_rate=24,
        sliding_window=12,
        index_topk=128,
    ),
    # V4-Flash's own HCA ratio and window: 128 (block size 128), prompt over 4 HCA windows
    "v4_ratios_w128": Schedule(
        "v4_ratios_w128",
        (CSA, HCA, SWA),
        hc_mult=4,
        num_hash_layers=1,
        hca_rate=128,
        sliding_window=128,
        index_topk=16,
    ),
}
SEED_BASE = int(os.environ.get("DSV4_TEST_SEED", "0"))  # vary to probe other random models
PROMPT_LEN = {"v4_ratios_w128": 530}


class Checkpoints:
    """Lazily built ``(schedule, layout) -> directory`` plus the transformers model of each schedule."""

    def __init__(self, root: Path):
        self.root, self._hf, self._dirs = root, {}, {}

    def hf(self, schedule: str):
        if schedule not in self._hf:
            self._hf[schedule] = build_hf(
                SCHEDULES[schedule], seed=SEED_BASE + list(SCHEDULES).index(schedule)
            )
        return self._hf[schedule]

    def path(self, schedule: str, layout: str) -> Path:
        key = (schedule, layout)
        if key not in self._dirs:
            d = self.root / f"{schedule}-{layout}"
            model = self.hf(schedule)
            if layout == "deepseek":
                save_deepseek(model, d)
            elif layout == "transformers":
                save_transformers(model, d)
            else:  # transformers' module names
                model.save_pretrained(d, save_original_format=False)
            self._dirs[key] = d
        return self._dirs[key]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("dsv4"))


@pytest.fixture(scope="session")
def backends():
    return reference_backends()
