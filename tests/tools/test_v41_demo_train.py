"""The V4.1 demo model's trainer (``tools/v41demo``): its batched ops compute what the reference ops compute, and a
training step moves every weight it should.

The trainer runs the engine's own V4.1 modules on batched twins of the reference ops (the reference computes
one row at a time). If a twin drifted from its reference op, the demo would be trained on one function and
served with another; so a whole prefill and DSpark's draft rows of a committed tiny checkpoint are compared
here, reference ops against training ops.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from v41demo import train as v41  # noqa: E402
from v41demo.ops import train_backends  # noqa: E402

from deepinfer_core.models.deepseek_v41.model import DeepseekV41ForCausalLM  # noqa: E402
from deepinfer_core.testing.kit import reference_backends  # noqa: E402

DATA = ROOT / "tests" / "data" / "v41"


def _model(name: str, ops) -> DeepseekV41ForCausalLM:
    m = DeepseekV41ForCausalLM.from_checkpoint(DATA / name / "checkpoint", ops, torch.float32)
    m.use_kv_cache_dtype("unquantized")
    m.enable_dspark()
    return m


@pytest.mark.parametrize("name", ["flash_mini", "long_pool"])
def test_training_ops_compute_the_reference_forward_and_drafts(name):
    """Two sequences of 90 random tokens: hidden rows (with DSpark's taps) and the draft block rows of 6
    anchors, reference ops against training ops, to float32 rounding."""
    got = []
    for ops in (reference_backends(), train_backends()):
        m = _model(name, ops)
        ids = torch.randint(3, m.vocab_size - 1, (2, 90), generator=torch.Generator().manual_seed(1))
        batch, hidden, pools = v41.prefill(m, ids)
        seq, p = torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 17, 70, 5, 40, 80])
        got.append((hidden, v41.draft_rows(m, ids, batch, hidden, pools, seq, p)))
    (ref_h, ref_x), (h, x) = got
    assert ref_h.abs().max() > 1.0 and ref_x.abs().max() > 0.1  # real activations, not zeros
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x, ref_x, rtol=1e-5, atol=1e-4)


def test_a_training_step_trains_every_weight_but_the_indexers_and_biases(tmp_path):
    """On a tiny spec with the demo tokenizer: one backward pass gives a gradient to every trainable weight
    (the indexers' selection and the routers' biases get none, by design), the routers' loads are counted,
    and eight steps on one fixed batch lower both the target's and DSpark's loss."""
    from dataclasses import replace

    from v41golden.configs import by_name

    spec = replace(by_name("flash_mini"), name="tiny_demo", dim=64, moe_inter_dim=64)
    tokenizer = ROOT / "deepinfer_core" / "demo_model" / "tokenizer.json"
    torch.manual_seed(0)
    t = v41.build(tokenizer, tmp_path, torch.device("cpu"), spec)
    ids = torch.randint(3, 8192, (2, 48), generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(5)
    got = v41.step_losses(t, ids, 8, g)
    (got["loss"] + got["dspark"] + got["confidence"]).backward()
    none = sorted(n for n, p in t.params.items() if p.grad is None or not p.grad.abs().sum() > 0)
    assert none and all(".indexer." in n or n.endswith("gate.bias") for n in none), none
    assert any(".indexer." in n for n in none) and any(n.endswith("gate.bias") for n in none)
    assert t.params["mtp.2.markov_head.embed.weight"].grad.abs().sum() > 0
    assert t.params["layers.0.engram.embed.weight"].grad.abs().sum() > 0
    before = {n: p.detach().clone() for n, p in t.params.items() if n.endswith("gate.bias")}
    v41.balance(t, 1e-3)
    assert all(not torch.equal(before[n], t.params[n]) for n in before)
    tr = dict(v41.TRAIN, lr=3e-3, warmup=1, steps=8, time_cap_s=1e9, batch=2, seq_len=48)
    opt = torch.optim.AdamW([p for p in t.params.values() if p.requires_grad], lr=tr["lr"])
    first = None
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        got = v41.step_losses(t, ids, 8, torch.Generator().manual_seed(5))
        (got["loss"] + got["dspark"]).backward()
        opt.step()
        first = first or (got["loss"].item(), got["dspark"].item())
    assert got["loss"].item() < first[0] - 0.5 and got["dspark"].item() < first[1] - 0.5, (first, got)
