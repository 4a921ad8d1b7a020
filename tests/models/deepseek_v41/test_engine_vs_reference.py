"""The engine's V4.1 (``LLM(model=dir)``, paged KV, prompt logprobs, greedy decode) against DeepSeek's reference
on the committed goldens (``docs/v41_reference.md``).

- Unquantized KV against the reference's ``exact`` mode, on every golden config and prompt (1 to 450 tokens,
  across windows, compression groups and candidate blocks): at least 97% of prompt positions within 1e-3 and
  the median within 1e-4; greedy tokens equal until a near-tie in the reference. A request's comparison may
  stop at a disagreement a reference top-k margin below 3e-4 explains (it never needs to here).
- The trained FP8 / FP4 KV (``kv_cache_dtype="auto"``) against ``kvq_on``: only on aggregate, because the
  quantised reference is chaotic (a 1e-6 weight change moves its logprobs by ~1e-2); bounds in
  :data:`QUANTIZED_BOUNDS`, measured values in ``docs/models.md``.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_core import LLM, SamplingParams
from tests.models.deepseek_v41.goldens import (
    CONFIGS,
    Agreement,
    checkpoint,
    greedy_prefix,
    prompt_diffs,
    prompts,
)

GREEDY = 16
#: the quantized engine: mean |logprob diff| over prompt positions and share of greedy tokens equal (from the
#: start, until a near-tie) against each reference mode; measured values in docs/models.md
QUANTIZED_BOUNDS = {
    "kvq_on": {"mean_abs": 0.5, "greedy_share": 0.1},
    "exact": {"mean_abs": 0.5, "greedy_share": 0.1},
}


def run(
    name: str, kv_cache_dtype: str, modes: tuple[str, ...], max_len: int = 1 << 30
) -> dict[str, Agreement]:
    g, idx = prompts(name)
    idx = [i for i in idx if len(g[f"prompt.{i}.ids"]) <= max_len]
    llm = LLM(model=str(checkpoint(name)), kv_cache_dtype=kv_cache_dtype, dtype="float32")
    params = SamplingParams(max_tokens=GREEDY, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": g[f"prompt.{i}.ids"].tolist()} for i in idx], params, use_tqdm=False
    )
    return {mode: compare(g, idx, outs, mode) for mode in modes}


def compare(g: dict[str, torch.Tensor], idx: list[int], outs: list, mode: str) -> Agreement:
    diffs, stopped, equal, required = [], 0, 0, 0
    for i, out in zip(idx, outs, strict=True):
        ids = g[f"prompt.{i}.ids"].tolist()
        got = torch.tensor([out.prompt_logprobs[t + 1][ids[t + 1]].logprob for t in range(len(ids) - 1)])
        margins = g[f"{mode}.{i}.margins"]
        d, stop = prompt_diffs(g[f"{mode}.{i}.logprob"], got, margins)
        if mode != "exact":  # aggregate comparisons count every position
            d, stop = (got - g[f"{mode}.{i}.logprob"]).abs(), False
        diffs.append(d)
        stopped += stop
        e, r, excused = greedy_prefix(
            g[f"{mode}.{i}.greedy_ids"].tolist(), out.outputs[0].token_ids, g[f"{mode}.{i}.greedy_top2_gap"],
            g[f"{mode}.{i}.greedy_margins"], float(margins.min()),
        )  # fmt: skip
        excused = excused and mode == "exact"
        stopped += excused
        equal += min(e, r)
        required += e if excused else r
    return Agreement(torch.cat(diffs), stopped, equal, required)


@pytest.mark.parametrize("name", CONFIGS)
def test_unquantized_kv_equals_the_exact_reference(name):
    a = run(name, "unquantized", ("exact",))["exact"]
    print(
        f"{name}: {a.within_1e3:.4f} within 1e-3, median {a.median:.2e}, max {float(a.diffs.max()):.2e}, "
        f"greedy {a.greedy_equal}/{a.greedy_compared}, stopped {a.stopped}"
    )
    assert a.diffs.numel() > 0
    assert a.within_1e3 >= 0.97, f"{name}: only {a.within_1e3:.3f} of positions within 1e-3"
    assert a.median <= 1e-4, f"{name}: median |diff| {a.median:.2e}"
    assert a.greedy_equal >= a.greedy_compared, f"{name}: greedy tokens {a.greedy_equal}/{a.greedy_compared}"


def test_quantized_kv_on_aggregate():
    """reindex_r2's prompts up to 96 tokens (the quantised reference ops are slow on the CPU). Against
    ``kvq_on`` the gap is mostly the release's FP8 activation quantisation in every GEMM, which the engine's
    float32 GEMMs do not do; against ``exact`` it is the KV / index round trips alone."""
    on = run("reindex_r2", "auto", ("kvq_on", "exact"), max_len=96)
    for mode, a in on.items():
        mean, share = float(a.diffs.mean()), a.greedy_equal / max(1, a.greedy_compared)
        print(
            f"reindex_r2 quantized KV vs {mode}: mean |diff| {mean:.3e}, median {a.median:.3e}, greedy {share:.2f}"
        )
        bound = QUANTIZED_BOUNDS[mode]
        assert mean <= bound["mean_abs"], f"vs {mode}: mean |logprob diff| {mean:.3e}"
        assert share >= bound["greedy_share"], f"vs {mode}: greedy agreement {share:.2f}"
