"""With expert parallelism each rank reads only its own routed experts from a V4.1 checkpoint: the loader,
given the rank's share of the EPLB placement, reads every other tensor and exactly that rank's experts, and the
model holds the same expert weights a full load sharded afterwards (``distributed.ep.shard_model``) holds."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from deepinfer_core.distributed.ep import initial_placement, shard_model
from deepinfer_core.models.deepseek_v41 import DeepseekV41ForCausalLM
from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.reference import reference_op
from tests.models.deepseek_v41.goldens import checkpoint

BACKENDS = Backends("reference", **{c: reference_op(c) for c in CONCERNS})
WORLD = 2
EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.")


def load(owns_expert=None) -> DeepseekV41ForCausalLM:
    return DeepseekV41ForCausalLM.from_checkpoint(
        checkpoint("flash_mini"), BACKENDS, torch.float32, owns_expert=owns_expert
    )


@pytest.fixture(scope="module")
def full():
    return load()


@pytest.fixture(scope="module")
def placement(full):
    return initial_placement(full.cfg.num_hidden_layers, full.cfg.n_routed_experts, WORLD, 0)


def slots(placement, rank: int) -> list[set[int]]:
    per = placement.phy2log.shape[1] // WORLD
    return [set(row[rank * per : (rank + 1) * per].tolist()) for row in placement.phy2log]


def stored_bytes() -> dict[str, int]:
    path = checkpoint("flash_mini")
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors |= load_file(str(f))
    return {k: t.numel() * t.element_size() for k, t in tensors.items()}


def test_each_rank_reads_only_its_experts_and_everything_else(full, placement):
    size = stored_bytes()
    assert full.loaded.bytes_read == sum(size[n] for n in full.loaded.names)
    tables = [k for t in full.loaded.mapped for k in (t, t.replace(".weight", ".scale"))]  # memory-mapped
    assert full.loaded.mapped and not set(tables) & set(full.loaded.names)
    assert sorted(full.loaded.names + tables) == sorted(size)  # the DSpark stages (mtp.*) included
    for rank in range(WORLD):
        mine = slots(placement, rank)
        model = load(lambda layer, e, mine=mine: e in mine[layer])
        want = [n for n in full.loaded.names if not (m := EXPERT.match(n)) or int(m[2]) in mine[int(m[1])]]
        assert model.loaded.names == want
        skipped = set(full.loaded.names) - set(want)
        assert skipped and all(EXPERT.match(n) for n in skipped)
        assert model.loaded.bytes_read == full.loaded.bytes_read - sum(size[n] for n in skipped)


def test_a_rank_holds_the_experts_a_sharded_full_load_holds(placement):
    rank = 1
    mine = slots(placement, rank)
    part = load(lambda layer, e: e in mine[layer])
    sharded = load()
    shard_model(sharded, placement, rank, WORLD)
    for layer, (a, b) in enumerate(zip(part.layers, sharded.layers, strict=True)):
        got, ref = a.ffn.routed, b.ffn.routed
        assert set(got.expert_ids) == set(ref.expert_ids) == mine[layer]
        index = {e: j for j, e in enumerate(ref.expert_ids)}
        for j, e in enumerate(got.expert_ids):
            for name in ("w1", "w2", "w3"):
                x, y = getattr(got, name)[j], getattr(ref, name)[index[e]]
                assert torch.equal(x.data, y.data) and torch.equal(x.scale, y.scale)
