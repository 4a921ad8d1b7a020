"""Logits of every prompt position match transformers' DeepseekV4ForCausalLM, for several layer schedules
and every checkpoint layout.

Tolerance: 1e-3 max abs (logits std ~2). Near-ties in the MoE router or the indexer's top-k may flip
under float32 rounding and move some positions by more, so at least 97% of positions must be within
tolerance and the median position error must stay tiny; the tolerance itself is never loosened. A flip in
an early CSA layer propagates (through the compressed entries) to every later position, so the test models
use 16 indexer heads: with 8, a query sometimes had fewer than ``index_topk`` entries with a non-zero score,
and the order among the exact ReLU-zero ties is arbitrary in both implementations."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.models.deepseek_v4 import DeepseekV4ForCausalLM

from .conftest import SCHEDULES
from .tiny import full_logits, tokens

TOL = 1e-3
PROMPT = 320  # crosses every compression (4, 16, 24, 32) and window (4..16) boundary many times


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids]), use_cache=False).logits[0].float()


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, label: str) -> tuple[float, float]:
    assert ours.shape == ref.shape
    assert ref.std() > 1.0, "test model too flat to be meaningful"
    err = (ours - ref).abs().amax(dim=-1)
    within = (err <= TOL).float().mean().item()
    med = err.median().item()
    print(f"{label}: max {err.max().item():.2e} median {med:.2e} within {within:.3f}")
    assert within >= 0.97 and med <= 1e-4, (
        f"{label}: max {err.max():.3g}, median {med:.3g}, {within:.1%} within {TOL}"
    )
    return err.max().item(), med


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("layout", ["deepseek", "transformers"])
def test_prompt_logits_match_transformers(checkpoints, backends, schedule, layout):
    model = DeepseekV4ForCausalLM.from_checkpoint(checkpoints.path(schedule, layout), backends, torch.float32)
    assert model.layout == layout
    ids = tokens(PROMPT, seed=7)
    assert_logits_close(
        full_logits(model, ids), hf_logits(checkpoints.hf(schedule), ids), f"{schedule}/{layout}"
    )


def test_transformers_module_names_layout_loads_the_same_weights(checkpoints, backends):
    """``save_pretrained(save_original_format=False)``: stacked experts, ``self_attn.*`` module names."""
    path = checkpoints.path("swa_csa_hca_hc2", "transformers-modules")
    model = DeepseekV4ForCausalLM.from_checkpoint(path, backends, torch.float32)
    ids = tokens(80, seed=3)
    assert_logits_close(
        full_logits(model, ids), hf_logits(checkpoints.hf("swa_csa_hca_hc2"), ids), "modules-layout"
    )


@pytest.mark.parametrize("n", [1, 2, 5])
def test_short_prompts_match_transformers(checkpoints, backends, n):
    model = DeepseekV4ForCausalLM.from_checkpoint(
        checkpoints.path("hc4_hca32_hash2", "deepseek"), backends, torch.float32
    )
    ids = tokens(n, seed=11 + n)
    assert_logits_close(full_logits(model, ids), hf_logits(checkpoints.hf("hc4_hca32_hash2"), ids), f"len{n}")
