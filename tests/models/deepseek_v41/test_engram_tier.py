"""The Engram tables are a host memory tier: memory-mapped from the checkpoint's shard (the table tensors
live inside the file's mapping, nothing of them is read at load time), read by row with the stored values,
and reported apart from the KV budget (``host_tier_bytes``). That the model's outputs stay exact with the
mapped tables is what ``test_engine_vs_reference.py`` checks on every golden config."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from deepinfer_core import LLM
from deepinfer_core.models.deepseek_v41 import DeepseekV41ForCausalLM
from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.quant_formats import scale_to_float32
from deepinfer_core.ops.reference import reference_op
from tests.models.deepseek_v41.goldens import checkpoint

BACKENDS = Backends("reference", **{c: reference_op(c) for c in CONCERNS})


def mapping_of(t: torch.Tensor) -> str | None:
    """The file backing the memory mapping that holds ``t``'s data, from ``/proc/self/maps``."""
    ptr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi:
                return parts[5] if len(parts) > 5 else None
    return None


@pytest.fixture(scope="module")
def model():
    return DeepseekV41ForCausalLM.from_checkpoint(checkpoint("flash_mini"), BACKENDS, torch.float32)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_tables_are_views_of_the_shard_mapping_and_not_read_at_load(model):
    weight_map = json.loads((checkpoint("flash_mini") / "model.safetensors.index.json").read_text())[
        "weight_map"
    ]
    engram_layers = [i for i, b in enumerate(model.layers) if b.engram is not None]
    assert engram_layers == [0, 3]
    for i in engram_layers:
        key = f"layers.{i}.engram.embed.weight"
        table = model.layers[i].engram.embed.value
        scale_key = key.replace(".weight", ".scale")
        for t, k in ((table.codes, key), (table.scales, scale_key)):
            assert mapping_of(t) == os.path.realpath(checkpoint("flash_mini") / weight_map[k]), k
        assert key in model.loaded.mapped and key not in model.loaded.names


def test_rows_are_the_stored_rows_dequantised(model):
    stored = {}
    for f in sorted(checkpoint("flash_mini").glob("*.safetensors")):
        stored |= load_file(str(f))
    ids = torch.tensor([[0, 303, 5], [17, 17, 250]])
    table = model.layers[0].engram.embed.value
    codes, scales = stored["layers.0.engram.embed.weight"], stored["layers.0.engram.embed.scale"]
    want = (codes.float().unflatten(-1, (-1, 32)) * scale_to_float32(scales).unsqueeze(-1)).flatten(-2)
    assert torch.equal(table.rows(ids, torch.float32), want[ids])


def test_table_bytes_are_reported_apart_from_the_kv_budget(model):
    cfg = model.cfg.engram
    want = sum(rows * (cfg.head_dim + cfg.head_dim // 32) for rows in cfg.num_embeddings)
    assert model.host_tier_bytes == want == (304 + 462) * 33
    llm = LLM(model=str(checkpoint("flash_mini")), kv_cache_dtype="unquantized", dtype="float32")
    assert llm.get_stats()["host_tier_bytes"] == want


def test_every_layer_s_rows_are_read_in_the_background_before_the_first_block_runs(monkeypatch):
    """The step starts reading both Engram layers' rows (layers 0 and 3) before block 0 runs; the reads run
    on the ``engram-fetch`` thread, and layer 3 waits only when it needs its rows."""
    import threading

    from deepinfer_core import SamplingParams
    from deepinfer_core.models.deepseek_v41 import block as block_mod
    from deepinfer_core.models.deepseek_v41 import engram_tier

    events: list[tuple[str, str]] = []
    gather, block_forward, wait = engram_tier._gather, block_mod.Block.forward, engram_tier.PendingRows.wait

    def gathering(table, ids):
        events.append(("gather", threading.current_thread().name))
        return gather(table, ids)

    def forwarding(self, h, *args):
        events.append(("block", str(self.attn.role.layer)))
        return block_forward(self, h, *args)

    def waiting(self, dtype):
        events.append(("wait", ""))
        return wait(self, dtype)

    monkeypatch.setattr(engram_tier, "_gather", gathering)
    monkeypatch.setattr(block_mod.Block, "forward", forwarding)
    monkeypatch.setattr(engram_tier.PendingRows, "wait", waiting)
    llm = LLM(model=str(checkpoint("flash_mini")), kv_cache_dtype="unquantized", dtype="float32")
    events.clear()
    llm.generate([{"prompt_token_ids": list(range(5, 40))}], SamplingParams(max_tokens=1), use_tqdm=False)
    threads = {name for kind, name in events if kind == "gather"}
    assert threads and all(name.startswith("engram-fetch") for name in threads), threads
    first_block = events.index(("block", "0"))
    # codes and scales of two layers were started (submitted) before block 0; block 3 waits after block 2 ran
    assert sum(1 for kind, _ in events[:first_block] if kind == "wait") == 0
    assert events.index(("block", "2")) < [i for i, e in enumerate(events) if e[0] == "wait"][1]


def test_a_failed_read_is_raised_where_the_layer_waits(model):
    table = model.layers[0].engram.embed.value
    pending = table.fetch(torch.tensor([[0, table.codes.shape[0] + 5]]))  # a row past the table's end
    with pytest.raises(IndexError):
        pending.wait(torch.float32)
    assert table.rows(torch.tensor([[1, 2]]), torch.float32).shape[:2] == (1, 2)  # the thread goes on


def _greedy(llm, prompts):
    from deepinfer_core import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [(o.outputs[0].token_ids, [lp[t] for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for o in outs]  # fmt: skip


def _logprob_value(x):
    return getattr(x, "logprob", x)


def test_tables_read_in_the_step_give_the_thread_path_s_tokens_and_logprobs(monkeypatch):
    """``engram_in_step``: where the device reads host memory in place (``MemoryOps.reads_host_memory``, here
    the CPU reference platform made to declare it), a step reads its rows through ``MemoryOps.host_rows``
    itself, right after hashing, with no fetch thread and nothing prepared before static steps; the tokens and
    logprobs are those of the fetch-thread path (the same bytes dequantised the same way), batched, over
    several steps."""
    import threading

    from deepinfer_core.models.deepseek_v41 import engram_tier
    from deepinfer_core.ops.reference.memory import ReferenceMemoryOps

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (9, 23, 40)]
    kw = dict(model=str(checkpoint("flash_mini")), kv_cache_dtype="unquantized", dtype="float32")
    want = _greedy(LLM(**kw, engram_in_step=False), prompts)

    reads, gathers = [], []
    monkeypatch.setattr(ReferenceMemoryOps, "reads_host_memory", True)
    real_rows, real_gather = ReferenceMemoryOps.host_rows, engram_tier._gather
    monkeypatch.setattr(
        ReferenceMemoryOps,
        "host_rows",
        lambda self, table, ids: reads.append(threading.current_thread().name) or real_rows(self, table, ids),
    )
    monkeypatch.setattr(engram_tier, "_gather", lambda t, ids: gathers.append(1) or real_gather(t, ids))
    llm = LLM(**kw, engram_in_step=True)
    assert llm.engine.model.engram_in_step
    got = _greedy(llm, prompts)
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, lp_got), (_, lp_want) in zip(got, want):
        assert [_logprob_value(x) for x in lp_got] == [_logprob_value(x) for x in lp_want]
    assert reads and set(reads) == {threading.main_thread().name} and not gathers


def test_engram_in_step_is_refused_where_the_device_cannot_read_host_memory():
    from deepinfer_core.config import ConfigError

    with pytest.raises(ConfigError, match="engram_in_step=True.*reads_host_memory"):
        LLM(model=str(checkpoint("flash_mini")), kv_cache_dtype="unquantized", engram_in_step=True)


def test_tables_larger_than_half_the_host_s_memory_stay_on_the_fetch_thread(monkeypatch):
    from deepinfer_core.models.deepseek_v41 import model as model_mod
    from deepinfer_core.ops.reference.memory import ReferenceMemoryOps

    monkeypatch.setattr(ReferenceMemoryOps, "reads_host_memory", True)
    llm = LLM(model=str(checkpoint("flash_mini")), kv_cache_dtype="unquantized", dtype="float32")
    model = llm.engine.model
    assert model.engram_in_step  # auto: the tiny tables fit
    monkeypatch.setattr(model_mod, "host_memory_bytes", lambda: 2 * model.host_tier_bytes - 2)
    fresh = DeepseekV41ForCausalLM.from_checkpoint(checkpoint("flash_mini"), model.backends, torch.float32)
    assert not fresh.place_engram(None) and not fresh.engram_in_step
    assert fresh.place_engram(True) and fresh.engram_in_step  # asked for: placed whatever the size
