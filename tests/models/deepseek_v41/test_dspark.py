"""The DSpark draft head (``mtp.*``) against DeepSeek's reference ``forward_spec`` (``tests/data/v41/*/dspark.safetensors``,
written by ``tools/v41golden/dspark.py``; its docstring has the protocol).

The engine runs the protocol on the model with a paged-KV harness, float32, ``kv_cache_dtype="unquantized"``
against the reference's ``exact`` mode: prefill the context, then for each step feed the reference's token,
write the stages' windows from the taps of the computed positions, and draft a block from the reference's
draft input ``y_s``. The Markov chain is fed the reference's drafted tokens (teacher forcing), so every slot's
distribution is comparable even after a near-tie. Criteria (those of the V4.1 model tests): the draft ids
equal the reference's at every slot whose top-2 gap is at least 1e-4; the drafted tokens' logprobs (Markov
bias included) and the top-8 logprobs within 1e-3 at >= 97% of values with the median <= 1e-4; the
confidence head's raw output likewise.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from deepinfer_core.models.deepseek_v41 import DeepseekV41ForCausalLM
from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.reference import reference_op
from deepinfer_core.testing.kv_harness import PagedKVHarness
from tests.models.deepseek_v41.goldens import CONFIGS, DATA, NEAR_TIE, checkpoint

BACKENDS = Backends("reference", **{c: reference_op(c) for c in CONCERNS})
MODE = "exact"


def load(name: str, kv_cache_dtype: str = "unquantized", path=None) -> DeepseekV41ForCausalLM:
    """A golden config's checkpoint (or the one at ``path``) with DSpark on."""
    model = DeepseekV41ForCausalLM.from_checkpoint(path or checkpoint(name), BACKENDS, torch.float32)
    model.use_kv_cache_dtype(kv_cache_dtype)
    model.enable_dspark()
    return model


def drafts_teacher_forced(model, h: PagedKVHarness, sid: int, pos: int, y: int, forced: list[int]):
    """Draft a block at last computed position ``pos`` with next token ``y``; the Markov chain takes ``forced``
    as the drafted tokens. -> (log-probs [B, V], confidence [B])."""
    batch = h.step({sid: [y]}, positions_from={sid: pos})
    x = model.dspark_block(batch, h.pools)[0]
    base = model.dspark_logits(x)
    prev = torch.tensor([y] + forced[:-1])
    bias, embed = model.dspark_markov(prev)
    return (base + bias).log_softmax(-1), model.dspark_confidence(x, embed)


def run_protocol(model, ctx: list[int], fed: list[int], ys: list[int], forced: torch.Tensor):
    h = PagedKVHarness(model.cache_specs(), num_blocks=max(64, 2 * len(ctx)))
    sid = h.add_sequence()
    batch = h.step({sid: ctx}, logits="all")
    model.dspark_context(batch, model.forward(batch, h.pools), h.pools)
    out = []
    for s, (token, y) in enumerate(zip(fed, ys)):
        batch = h.step({sid: [token]})
        hidden = model.forward(batch, h.pools)
        model.dspark_context(batch, hidden, h.pools)
        out.append(drafts_teacher_forced(model, h, sid, len(ctx) + s, y, forced[s].tolist()))
    return out


def check_drafts(name: str, g: dict[str, torch.Tensor], model: DeepseekV41ForCausalLM) -> None:
    """Run the protocol on every golden context of ``g`` and assert the criteria of the module docstring."""
    contexts = sorted({int(k.split(".")[1]) for k in g if k.startswith("context.")})
    lp_diffs, conf_diffs, equal, compared = [], [], 0, 0
    for c in contexts:
        r = {k[len(f"{MODE}.{c}.") :]: v for k, v in g.items() if k.startswith(f"{MODE}.{c}.")}
        steps = run_protocol(
            model, g[f"context.{c}.ids"].tolist(), r["fed_ids"].tolist(), r["draft_input_ids"].tolist(),
            r["draft_ids"],
        )  # fmt: skip
        for s, (lp, conf) in enumerate(steps):
            ids = r["draft_ids"][s]
            got = lp.gather(1, ids[:, None])[:, 0]
            lp_diffs += [(got - r["draft_logprob"][s]).abs()]
            top = lp.gather(1, r["draft_topk_ids"][s].long())
            lp_diffs += [(top - r["draft_topk_logprobs"][s]).abs().flatten()]
            conf_diffs += [(conf - r["confidence"][s]).abs()]
            sure = r["draft_top2_gap"][s] >= NEAR_TIE
            equal += int((lp.argmax(-1) == ids)[sure].sum())
            compared += int(sure.sum())
    lp_d, conf_d = torch.cat(lp_diffs), torch.cat(conf_diffs)
    within = float((lp_d <= 1e-3).float().mean())
    print(
        f"{name}: draft ids {equal}/{compared} equal; logprobs {within:.4f} within 1e-3, median "
        f"{float(lp_d.median()):.2e}, max {float(lp_d.max()):.2e}; confidence max {float(conf_d.max()):.2e}"
    )
    assert compared > 0 and equal == compared
    assert within >= 0.97 and float(lp_d.median()) <= 1e-4
    assert float((conf_d <= 1e-3).float().mean()) >= 0.97 and float(conf_d.median()) <= 1e-4


@pytest.mark.parametrize("name", CONFIGS)
def test_dspark_drafts_equal_the_reference(name):
    check_drafts(name, load_file(str(DATA / name / "dspark.safetensors")), load(name))


def test_dspark_with_the_trained_fp8_kv_on_aggregate():
    """``kv_cache_dtype="auto"`` (FP8 window KV for the backbone and the stages, FP8 block KV) against the
    reference with its KV simulation on (``kvq_on``): only on aggregate, because the quantised reference is
    chaotic (docs/v41_reference.md). Measured: mean |logprob diff| of the drafted tokens 0.57 / 0.15 / 0.10
    (flash_mini / long_pool / reindex_r2), draft ids equal 19/30, 16/18, 21/24."""
    diffs, equal, total = [], 0, 0
    for name in CONFIGS:
        g = load_file(str(DATA / name / "dspark.safetensors"))
        model = load(name, "auto")
        for c in sorted({int(k.split(".")[1]) for k in g if k.startswith("context.")}):
            r = {k[len(f"kvq_on.{c}.") :]: v for k, v in g.items() if k.startswith(f"kvq_on.{c}.")}
            steps = run_protocol(
                model, g[f"context.{c}.ids"].tolist(), r["fed_ids"].tolist(), r["draft_input_ids"].tolist(),
                r["draft_ids"],
            )  # fmt: skip
            for s, (lp, _) in enumerate(steps):
                ids = r["draft_ids"][s]
                diffs.append((lp.gather(1, ids[:, None])[:, 0] - r["draft_logprob"][s]).abs())
                equal += int((lp.argmax(-1) == ids).sum())
                total += ids.numel()
    mean = float(torch.cat(diffs).mean())
    print(f"quantized DSpark vs kvq_on: mean |diff| {mean:.3e}, draft ids {equal}/{total}")
    assert mean <= 0.5 and equal / total >= 0.6
