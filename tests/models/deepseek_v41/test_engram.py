"""Engram's compressed token map and n-gram hash ids equal the reference's (``engram.safetensors``) on every
golden prompt, including the look-back before the first token and the 96-token text whose case and accent
variants collide in the compressed vocabulary."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from deepinfer_core.models.deepseek_v41 import DeepseekV41Config
from deepinfer_core.models.deepseek_v41.engram import EngramHasher, bucket_primes, is_prime
from tests.models.deepseek_v41.goldens import CONFIGS, DATA, checkpoint, prompts


@pytest.mark.parametrize("name", CONFIGS)
def test_token_map_and_hash_ids_equal_the_reference(name):
    cfg = DeepseekV41Config.from_dict(json.loads((checkpoint(name) / "config.json").read_text()))
    hasher = EngramHasher.build(cfg.engram, checkpoint(name))
    golden = load_file(str(DATA / name / "engram.safetensors"))
    assert torch.equal(hasher.token_map, golden["token_map"])
    g, idx = prompts(name)
    n = cfg.engram.max_ngram_size
    for i in idx:
        ids = g[f"prompt.{i}.ids"]
        padded = torch.cat([torch.full((n,), -1), hasher.token_map[ids]])
        history = torch.stack([padded[n - s : n - s + len(ids)] for s in range(n)], dim=1)
        assert torch.equal(hasher.hash_ids(history).int(), golden[f"hash.{i}.ids"]), f"prompt {i}"


def test_primes_are_unique_and_searched_upwards():
    cfg = DeepseekV41Config.from_dict(json.loads((checkpoint("flash_mini") / "config.json").read_text()))
    primes = [p for layer in bucket_primes(cfg.engram) for per_n in layer for p in per_n]
    assert len(set(primes)) == len(primes) and all(is_prime(p) and p >= cfg.engram.vocab_size for p in primes)
    assert [is_prime(n) for n in (1, 2, 561, 7919, 384_006_167, 2**61 - 1)] == [
        False,
        True,
        False,
        True,
        False,
        True,
    ]
