"""The bitmask layout agrees with the reference ``apply_bitmask``; the vocabulary rule keeps added
tokens out of constrained text."""

from __future__ import annotations

import torch

from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps
from deepinfer_core.structured import (
    GrammarVocab,
    allocate_bitmask,
    bitmask_width,
    pack_allowed,
    unpack_bitmask,
)
from deepinfer_core.structured.bitmask import bitmask_of_ids, token_allowed

V4_MARKERS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜▁pad▁｜>": 2,
    "<｜User｜>": 128803,
    "<think>": 128821,
    "</think>": 128822,
    "｜DSML｜": 128825,
    "<｜place▁holder▁no▁0｜>": 128000,
}


def test_pack_unpack_round_trip_and_reference_apply_agree():
    g = torch.Generator().manual_seed(0)
    for v in (1, 31, 32, 33, 1000, 129280):
        allowed = torch.rand(3, v, generator=g) < 0.3
        mask = pack_allowed(allowed)
        assert mask.dtype == torch.int32 and mask.shape == (3, bitmask_width(v))
        assert torch.equal(unpack_bitmask(mask, v), allowed)
        logits = torch.randn(3, v, generator=g)
        masked = ReferenceSamplingOps().apply_bitmask(logits, mask)
        assert torch.equal(torch.isfinite(masked), allowed)
        assert torch.equal(masked[allowed], logits[allowed])


def test_bit_31_and_helpers():
    mask = bitmask_of_ids([31, 32, 63], 64)
    assert mask.tolist() == [-(2**31), 1 - 2**31]
    assert token_allowed(mask, 31) and token_allowed(mask, 63) and not token_allowed(mask, 30)
    assert allocate_bitmask(2, 40).tolist() == [[-1, -1], [-1, -1]]


def test_v4_vocab_keeps_added_tokens_out_of_text_but_lets_eos_in(v4_tokenizer):
    vocab = GrammarVocab.from_tokenizer(v4_tokenizer, 129280, [1])
    text = unpack_bitmask(vocab.text_bitmask, 129280)
    for marker, idx in V4_MARKERS.items():
        assert v4_tokenizer.convert_tokens_to_ids(marker) == idx
        assert not text[idx], marker
    assert text[1]  # EOS ends constrained text
    ordinary = v4_tokenizer.encode('hello world {"a": 1}', add_special_tokens=False)
    assert all(text[t] for t in ordinary)
    assert int(text.sum()) == 129280 - len(v4_tokenizer.get_added_vocab()) + 1
    assert (vocab.think_start_id, vocab.think_end_id) == (128821, 128822)
    assert unpack_bitmask(vocab.stop_bitmask, 129280).nonzero().flatten().tolist() == [1]
    reasoning = unpack_bitmask(vocab.reasoning_bitmask, 129280)
    assert not reasoning[1] and int(reasoning.sum()) == 129280 - 1


def test_vocab_fingerprint_tracks_vocabulary_size_and_stops(v4_tokenizer):
    a = GrammarVocab.from_tokenizer(v4_tokenizer, 129280, [1])
    assert a.fingerprint == GrammarVocab.from_tokenizer(v4_tokenizer, 129280, [1]).fingerprint
    assert a.fingerprint != GrammarVocab.from_tokenizer(v4_tokenizer, 129312, [1]).fingerprint
    assert a.fingerprint != GrammarVocab.from_tokenizer(v4_tokenizer, 129280, [1, 128805]).fingerprint


def test_vocab_without_any_stop_token_is_an_error(v4_tokenizer):
    import pytest

    assert v4_tokenizer.eos_token_id is None  # tokenizer.json alone does not name EOS
    with pytest.raises(ValueError, match="need a stop token"):
        GrammarVocab.from_tokenizer(v4_tokenizer, 129280)
