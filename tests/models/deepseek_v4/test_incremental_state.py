"""Paged incremental state: any chunking of a prompt, token-by-token decode, batching with other requests,
different block sizes and rollback all give the logits of one full forward (the reference ops are batch
invariant and every piece of state is addressed by absolute position, so results are bit-identical)."""

from __future__ import annotations

import random

import pytest
import torch

from deepinfer_core.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer_core.testing.kv_harness import PagedKVHarness

from .tiny import full_logits, tokens


def _model(checkpoints, backends, schedule):
    return DeepseekV4ForCausalLM.from_checkpoint(
        checkpoints.path(schedule, "deepseek"), backends, torch.float32
    )


def _run(model, harness, plan: list[dict[int, list[int]]]) -> dict[int, list[torch.Tensor]]:
    """Run each step of ``plan`` (sequence -> tokens); collect every row's logits per sequence."""
    out: dict[int, list[torch.Tensor]] = {}
    for chunks in plan:
        batch = harness.step(chunks, logits="all")
        logits = model.compute_logits(model.forward(batch, harness.pools))
        qs = batch.query_start_loc.tolist()
        for i, sid in enumerate(chunks):
            out.setdefault(sid, []).append(logits[qs[i] : qs[i + 1]])
    return out


def _random_plan(
    rng: random.Random, seqs: dict[int, list[int]], prefill: dict[int, int], max_chunk: int
) -> list[dict[int, list[int]]]:
    """Steps that prefill each sequence in random chunks up to ``prefill[sid]`` tokens, then decode one token
    at a time; sequences start and finish at different steps."""
    pos = {s: 0 for s in seqs}
    plan = []
    while any(pos[s] < len(seqs[s]) for s in seqs):
        step = {}
        for s, ids in seqs.items():
            if pos[s] >= len(ids) or rng.random() < 0.2:
                continue
            n = rng.randint(1, max_chunk) if pos[s] < prefill[s] else 1
            step[s] = ids[pos[s] : pos[s] + n]
            pos[s] += len(step[s])
        if step:
            plan.append(step)
    return plan


@pytest.mark.parametrize(
    "schedule,block_size", [("swa_csa_hca_hc2", 32), ("hc4_hca32_hash2", 64), ("no_hash_topk_all", 24)]
)
def test_random_chunks_and_decode_match_full_forward(checkpoints, backends, schedule, block_size):
    model = _model(checkpoints, backends, schedule)
    a_ids, b_ids = tokens(150, seed=1), tokens(90, seed=2)
    ref_a, ref_b = full_logits(model, a_ids), full_logits(model, b_ids)
    harness = PagedKVHarness(model.cache_specs(), block_size=block_size, num_blocks=64, seed=5)
    a, b = harness.add_sequence(), harness.add_sequence()
    plan = _random_plan(random.Random(schedule), {a: a_ids, b: b_ids}, {a: 110, b: 60}, max_chunk=37)
    out = _run(model, harness, plan)
    assert torch.equal(torch.cat(out[a]), ref_a)
    assert torch.equal(torch.cat(out[b]), ref_b)


def test_rollback_recomputes_the_same_logits(checkpoints, backends):
    """Speculative rejection / preemption: shortening a request's length and feeding other tokens rewrites
    the state; feeding the original tokens again reproduces the original logits."""
    model = _model(checkpoints, backends, "swa_csa_hca_hc2")
    ids = tokens(70, seed=4)
    ref = full_logits(model, ids)
    h = PagedKVHarness(model.cache_specs(), block_size=16, num_blocks=32)
    s = h.add_sequence()
    _run(model, h, [{s: ids[:50]}])
    _run(model, h, [{s: tokens(13, seed=9)}])  # drafts that get rejected
    h.truncate(s, 50)
    got = _run(model, h, [{s: ids[50:57]}, {s: ids[57:58]}, {s: ids[58:]}])[s]
    assert torch.equal(torch.cat(got), ref[50:])


def test_released_window_state_is_reported(checkpoints, backends):
    """A block the step still needs (within the sliding window) must not be released by the engine."""
    model = _model(checkpoints, backends, "swa_csa_hca_hc2")
    h = PagedKVHarness(model.cache_specs(), block_size=16, num_blocks=32)
    s = h.add_sequence()
    _run(model, h, [{s: tokens(20, seed=1)}])
    batch = h.step({s: [5]})
    batch.block_tables["window"][0, 0] = -1  # position 20 - 7 = 13 is in block 0
    with pytest.raises(RuntimeError, match="released"):
        model.forward(batch, h.pools)


def test_cache_specs_geometry(checkpoints, backends):
    model = _model(checkpoints, backends, "swa_csa_hca_hc2")
    specs = {s.name: s for s in model.cache_specs()}
    w = 8  # sliding_window
    assert specs["layers.0.attn.swa_kv"].window == w - 1 and specs["layers.0.attn.swa_kv"].entry_shape == (
        32,
    )
    assert "layers.0.attn.compressor.state" not in specs  # sliding-window layer
    csa = specs["layers.1.attn.compressor.state"]
    assert (csa.group, csa.window, csa.entry_shape, csa.dtype) == (
        "window",
        2 * 4 - 1,
        (2, 64),
        torch.float32,
    )
    assert specs["layers.1.attn.compressor.kv"].tokens_per_entry == 4
    assert specs["layers.1.attn.indexer.keys"].entry_shape == (16,)
    assert specs["layers.2.attn.compressor.state"].window == 16 - 1
    assert specs["layers.2.attn.compressor.kv"].tokens_per_entry == 16
    assert "layers.2.attn.indexer.keys" not in specs  # HCA has no indexer
