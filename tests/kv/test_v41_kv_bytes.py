"""DeepSeek-V4.1-Flash's KV cache written as cache specs: the bytes per token they imply equal DeepSeek's
~890 bytes per token of global KV, and the engine allocates exactly that.

The specs follow the published config (``docs/v41_reference.md``, sections 3.1 and 8): 40 layers and 3
DSpark stages, window 128, ``compress_ratios = [0]*2 + [2]*18 + [1]*20 + [0]*3``, KV sources
[2, 8, 14, 20], index sources [2, 8, 14, 20, 24, 28, 32, 36]. A source publishes its compressed KV (read
by itself and the Reuse / Reindex layers up to the next source) and its index keys (read by the index
sources up to the next KV source)."""

from __future__ import annotations

import torch

from deepinfer_core.kv.budget import group_block_bytes, kv_footprint, plan_kv
from deepinfer_core.kv.packed import PackedFormat
from deepinfer_core.kv.spec import CacheSpec, check_specs, group_windows, required_block_multiple

N_LAYERS, N_MTP, WINDOW, HEAD_DIM, INDEX_DIM = 40, 3, 128, 512, 128
RATIOS = [0] * 2 + [2] * 18 + [1] * 20 + [0] * 3
KV_SOURCES = [2, 8, 14, 20]
INDEX_SOURCES = [2, 8, 14, 20, 24, 28, 32, 36]
FP4_CKV = PackedFormat("e2m1", "e4m3", 16, (HEAD_DIM,))
FP4_INDEX = PackedFormat("e2m1", "ue8m0", 32, (INDEX_DIM,))
FP8_WINDOW = PackedFormat("e4m3", "ue8m0", 32, (HEAD_DIM,))


def v41_flash_specs(dtype: torch.dtype | None = None) -> list[CacheSpec]:
    """The published model's specs, quantised as trained (``dtype=None``) or unquantised in ``dtype``."""

    def entry(name, group, ratio, fmt, dim, **kw):
        if dtype is None:
            return CacheSpec.packed_entries(name, group, ratio, fmt, **kw)
        return CacheSpec(name, group, ratio, (dim,), dtype, **kw)

    specs = []
    for i in range(N_LAYERS + N_MTP):
        specs.append(
            entry(
                f"layers.{i}.swa_kv",
                "window",
                1,
                FP8_WINDOW,
                HEAD_DIM,
                window=WINDOW - 1,
                writer=i,
                readers=(i,),
            )
        )
    for k, src in enumerate(KV_SOURCES):
        end = KV_SOURCES[k + 1] if k + 1 < len(KV_SOURCES) else N_LAYERS
        ratio = RATIOS[src]
        reuse = tuple(i for i in range(src, end) if RATIOS[i] > 0)
        reindex = tuple(i for i in INDEX_SOURCES if src <= i < end)
        specs.append(
            entry(f"layers.{src}.ckv", "global", ratio, FP4_CKV, HEAD_DIM, writer=src, readers=reuse)
        )
        specs.append(
            entry(f"layers.{src}.index_k", "global", ratio, FP4_INDEX, INDEX_DIM, writer=src, readers=reindex)
        )
        if ratio > 1:  # the compressor's kv and score of a group not yet complete (float32)
            specs.append(CacheSpec(f"layers.{src}.compressor.state", "window", 1, (2, HEAD_DIM), torch.float32, window=ratio - 1, writer=src, readers=(src,)))  # fmt: skip
    return specs


def test_the_specs_are_valid_for_the_published_layer_count():
    specs = v41_flash_specs()
    check_specs(specs, num_layers=N_LAYERS + N_MTP)
    assert group_windows(specs) == {"window": WINDOW - 1, "global": None}
    assert required_block_multiple(specs) == 2
    ckv20 = next(s for s in specs if s.name == "layers.20.ckv")
    assert ckv20.readers == tuple(range(20, 40)) and ckv20.tokens_per_entry == 1
    idx20 = next(s for s in specs if s.name == "layers.20.index_k")
    assert idx20.readers == (20, 24, 28, 32, 36)


def test_global_kv_is_890_bytes_per_token():
    fp = kv_footprint(v41_flash_specs())
    assert fp.bytes_per_token == 2.5 * 288 + 2.5 * 68 == 890
    window_kv = (N_LAYERS + N_MTP) * WINDOW * (512 + 16)
    compressor_state = 3 * 2 * 2 * 512 * 4
    assert (window_kv, compressor_state) == (2_906_112, 24 * 1024)
    assert fp.window_bytes == window_kv + compressor_state


def test_unquantised_global_kv_is_what_its_dtype_costs():
    assert kv_footprint(v41_flash_specs(torch.float32)).bytes_per_token == 2.5 * (512 + 128) * 4 == 6400
    assert kv_footprint(v41_flash_specs(torch.bfloat16)).bytes_per_token == 3200


def test_the_engine_allocates_exactly_890_bytes_per_token_of_global_kv():
    specs = v41_flash_specs()
    for block_size in (16, 64, 256):
        assert group_block_bytes(specs, block_size)["global"] == 890 * block_size
    layout = plan_kv(specs, 256, 8 << 30, 65536, max_num_seqs=4, max_num_batched_tokens=8192)
    assert layout.block_bytes["global"] == 890 * 256
    assert layout.num_blocks["global"] == 4 * 65536 // 256
