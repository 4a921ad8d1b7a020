"""Cache specs: open groups whose retention comes from their specs, writers and readers, packed entries
sized exactly."""

from __future__ import annotations

import pytest
import torch

from deepinfer_core.kv.packed import PackedFormat
from deepinfer_core.kv.spec import CacheSpec, check_specs, group_windows, required_block_multiple

F32 = torch.float32
FP4_CKV = PackedFormat("e2m1", "e4m3", 16, (512,))
FP4_INDEX = PackedFormat("e2m1", "ue8m0", 32, (128,))
FP8_WINDOW = PackedFormat("e4m3", "ue8m0", 32, (512,))


def test_packed_formats_count_codes_and_scales_exactly():
    assert (FP4_CKV.code_bytes, FP4_CKV.scale_bytes, FP4_CKV.entry_bytes) == (256, 32, 288)
    assert FP4_INDEX.entry_bytes == 64 + 4
    assert FP8_WINDOW.entry_bytes == 512 + 16
    assert PackedFormat("e2m1", "e4m3", 16, (2, 64)).entry_bytes == 2 * (32 + 4)
    assert FP4_CKV.name == "e2m1+e4m3/16"


@pytest.mark.parametrize(
    ("values", "scales", "block", "shape"),
    [
        ("e3m2", "e4m3", 16, (32,)),  # unknown code format
        ("e2m1", "float32", 16, (32,)),  # scales are one byte
        ("e2m1", "e4m3", 16, (40,)),  # not a whole number of scale blocks
        ("e2m1", "e4m3", 1, (3,)),  # three 4-bit codes do not fill whole bytes
        ("e4m3", "ue8m0", 32, ()),
    ],
)
def test_packed_format_rejects_a_layout_it_cannot_store_exactly(values, scales, block, shape):
    with pytest.raises(ValueError):
        PackedFormat(values, scales, block, shape)


def test_split_views_codes_then_scales_of_every_entry():
    fmt = PackedFormat("e2m1", "e4m3", 16, (2, 32))  # per entry: 2 x 16 code bytes, then 2 x 2 scales
    entries = torch.zeros(3, 4, fmt.entry_bytes, dtype=torch.uint8)
    entries[1, 2, :32] = torch.arange(32, dtype=torch.uint8)
    scale = torch.tensor([0.5, 2.0, 3.0, 448.0]).to(torch.float8_e4m3fn)
    entries[1, 2, 32:] = scale.view(torch.uint8)
    codes, scales = fmt.split(entries)
    assert codes.shape == (3, 4, 2, 16) and scales.shape == (3, 4, 2, 2)
    assert codes[1, 2].flatten().tolist() == list(range(32))
    assert scales[1, 2].float().flatten().tolist() == [0.5, 2.0, 3.0, 448.0]
    codes[0, 0, 1, 0] = 7  # views: writes land in the entries
    assert entries[0, 0, 16] == 7


def test_split_refuses_rows_of_another_width():
    with pytest.raises(ValueError, match="uint8"):
        FP4_INDEX.split(torch.zeros(2, FP4_INDEX.entry_bytes + 1, dtype=torch.uint8))


def test_a_packed_spec_is_a_byte_pool_of_exactly_the_format():
    spec = CacheSpec.packed_entries("l.ckv", "global", 2, FP4_CKV, writer=2, readers=(2, 3, 7))
    assert (spec.entry_shape, spec.dtype, spec.entry_bytes) == ((288,), torch.uint8, 288)
    assert spec.page_bytes(16) == 8 * 288
    assert spec.bytes_per_token == 144
    with pytest.raises(ValueError, match="packed"):
        CacheSpec("x", "global", 2, (512,), torch.uint8, packed=FP4_CKV)


def test_retention_follows_the_specs_not_the_group_name():
    specs = [
        CacheSpec("a", "window", 1, (4,), F32),  # a group named "window" that keeps everything
        CacheSpec("b", "compressed", 1, (4,), F32, window=7),  # and one named "compressed" that slides
        CacheSpec("c", "compressed", 1, (4,), F32, window=3),
        CacheSpec("d", "mixed", 1, (4,), F32, window=3),
        CacheSpec("e", "mixed", 4, (4,), F32),  # one spec needs the whole context: the group keeps it
    ]
    assert group_windows(specs) == {"window": None, "compressed": 7, "mixed": None}


def test_block_size_is_a_multiple_of_every_ratio():
    specs = [CacheSpec(f"r{r}", "g", r, (1,), F32) for r in (1, 2, 4, 128)]
    assert required_block_multiple(specs) == 128
    assert [s.entries_per_block(256) for s in specs] == [256, 128, 64, 2]
    with pytest.raises(ValueError, match="multiple of tokens_per_entry=128"):
        specs[3].entries_per_block(64)


@pytest.mark.parametrize(
    ("writer", "readers", "match"),
    [(None, (3,), "need a writer"), (4, (3, 5), "at or before"), (2, (5, 3), "ascending"), (-1, (), ">= 0")],
)
def test_writer_and_readers_are_checked_when_a_spec_is_made(writer, readers, match):
    with pytest.raises(ValueError, match=match):
        CacheSpec("s", "g", 1, (4,), F32, writer=writer, readers=readers)


def test_a_model_s_specs_have_unique_names_and_name_layers_that_exist():
    ok = [
        CacheSpec("src.kv", "global", 2, (4,), F32, writer=1, readers=(1, 2, 3)),
        CacheSpec("l0.win", "swa", 1, (4,), F32, window=3, writer=0, readers=(0,)),
    ]
    check_specs(ok, num_layers=4)
    check_specs(ok)  # a model that does not number its layers
    with pytest.raises(ValueError, match="outside 0..2"):
        check_specs(ok, num_layers=3)
    with pytest.raises(ValueError, match=r"\['l0.win'\] appear more than once"):
        check_specs(ok + [CacheSpec("l0.win", "swa", 1, (4,), F32, window=3)])
