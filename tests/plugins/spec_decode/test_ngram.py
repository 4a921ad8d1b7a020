"""n-gram prompt lookup: longest suffix first, most recent occurrence, bounded by k."""

import pytest

from deepinfer_spec_decode.ngram import ngram_propose


def test_repeats_what_followed_the_suffix():
    toks = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    assert ngram_propose(toks, k=3, min_n=1, max_n=3) == [8, 9, 1]


def test_prefers_the_longest_matching_suffix():
    # suffix [3] last followed by 9, but the 2-gram [2, 3] was followed by 4
    toks = [2, 3, 4, 0, 3, 9, 2, 3]
    assert ngram_propose(toks, k=1, min_n=1, max_n=2) == [4]
    assert ngram_propose(toks, k=1, min_n=1, max_n=1) == [9]


def test_uses_the_most_recent_earlier_occurrence():
    toks = [1, 2, 7, 1, 2, 8, 1, 2]
    assert ngram_propose(toks, k=1, min_n=2, max_n=2) == [8]


def test_no_recurrence_gives_no_drafts_and_k_bounds_the_length():
    assert ngram_propose([1, 2, 3, 4], k=4, min_n=1, max_n=3) == []
    assert ngram_propose([1, 2, 1, 2, 1, 2], k=10, min_n=2, max_n=2) == [1, 2]


def test_bad_bounds_are_rejected():
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        ngram_propose([1, 2], k=1, min_n=3, max_n=2)
