"""The example third-party plugin's grammar backend over the demo checkpoint's tokenizer (byte-level BPE,
8,192 tokens; 0 is BOS, 1 EOS, 2 and 3 chat markers)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from deepinfer_core.demo import DEMO_DIR

if "example" not in {ep.name for ep in md.entry_points(group="deepinfer")}:
    pytest.skip(
        "examples/third_party_backend is not installed (nox -s tests installs it)", allow_module_level=True
    )

EOS = 1
VOCAB = 8192


@pytest.fixture(scope="session")
def demo_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(DEMO_DIR / "tokenizer.json"), eos_token="<｜end▁of▁sentence｜>"
    )
